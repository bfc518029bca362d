// Fuzz target for what a peer controls before and at the start of a secure channel: the Hello
// (plaintext), the Auth (first record), and record authentication itself. Checks that the decoders
// never crash, that what DecodeHello accepts is consistent and re-encodes, that DecodeAuth never
// accepts a signature over another transcript, and that RecordOpener under a fixed key opens
// nothing but a record genuinely sealed under that key (re-sealing its plaintext must reproduce
// the input byte for byte), with Open and the stepwise OpenBegin/OpenUpdate/OpenFinish agreeing;
// and the Verdict of private swarms.
#include <google/protobuf/stubs/logging.h>

#include <cstddef>
#include <cstdint>
#include <cstring>

#include "net/crypto.h"
#include "net/handshake_messages.h"
#include "net/wire.h"

using colony::Bytes;
using colony::ByteSpan;
using colony::RawBuffer;
using colony::StatusCode;
using namespace colony::net;

namespace {

// Fixed, so that seeds made with them (fuzz/corpus/handshake) stay meaningful.
Key32 Filled(uint8_t first) {
  Key32 k;
  for (size_t i = 0; i < k.size(); ++i) k[i] = static_cast<uint8_t>(first + i);
  return k;
}
const Key32 kTranscript = Filled(0x10);
const Key32 kRecordKey = Filled(0x40);

// Malformed protobuf strings make libprotobuf log each rejection; discard its log to keep the
// fuzzer fast and its output readable.
[[maybe_unused]] const bool kProtobufQuiet = (google::protobuf::SetLogHandler(nullptr), true);

void CheckHello(ByteSpan in) {
  auto hello = DecodeHello(in, kProtocolMajor, kProtocolMinor);
  if (!hello.ok()) {
    if (hello.status().message().empty()) __builtin_trap();
    return;
  }
  if (hello->version_major != kProtocolMajor || hello->agent.size() > 128) __builtin_trap();
  Bytes again =
      EncodeHello(hello->ephemeral_key, hello->version_major, hello->version_minor, hello->agent);
  auto back = DecodeHello(again, kProtocolMajor, kProtocolMinor);
  if (!back.ok() || back->ephemeral_key != hello->ephemeral_key ||
      back->version_minor != hello->version_minor || back->agent != hello->agent) {
    __builtin_trap();
  }
}

void CheckAuth(ByteSpan in) {
  for (Role role : {Role::kInitiator, Role::kResponder}) {
    auto auth = DecodeAuth(in, role, kTranscript);
    if (!auth.ok()) {
      if (auth.status().message().empty()) __builtin_trap();
      continue;
    }
    if (!auth->peer.valid() || auth->listen_addrs.size() > 32 || auth->observed_addr.size() > 256) {
      __builtin_trap();
    }
    if (auth->limits.stream_window < 64 * 1024 ||
        auth->limits.connection_window < auth->limits.stream_window ||
        auth->limits.max_concurrent_streams < 1 || auth->limits.max_message_bytes < 64 * 1024) {
      __builtin_trap();
    }
    // The signature binds the transcript and the role.
    Key32 other = kTranscript;
    other[0] ^= 1;
    if (DecodeAuth(in, role, other).ok()) __builtin_trap();
    Role reflected = role == Role::kInitiator ? Role::kResponder : Role::kInitiator;
    if (DecodeAuth(in, reflected, kTranscript).ok()) __builtin_trap();
  }
}

void CheckVerdict(ByteSpan in) {
  auto verdict = DecodeVerdict(in);
  if (!verdict.ok()) {
    if (verdict.status().message().empty()) __builtin_trap();
    return;
  }
  if (verdict->reason.size() > kMaxVerdictReason) __builtin_trap();
}

void CheckRecord(const uint8_t* data, size_t size) {
  if (size < 4) return;
  ByteSpan prefix(data, 4);
  Bytes sealed(data + 4, data + size);
  RecordOpener opener(kRecordKey);
  colony::Status st = opener.Open(prefix, sealed);

  // The stepwise API must reach the same verdict and plaintext, however the input is split.
  bool stepwise_ok = false;
  Bytes stepwise_plain;
  if (sealed.size() >= kTagSize) {
    const size_t n = sealed.size() - kTagSize;
    stepwise_plain.resize(n);
    RecordOpener steps(kRecordKey);
    steps.OpenBegin(prefix);
    size_t cut = n == 0 ? 0 : data[4 % size] % (n + 1);
    steps.OpenUpdate(ByteSpan(data + 4, cut), stepwise_plain.data());
    steps.OpenUpdate(ByteSpan(data + 4 + cut, n - cut), stepwise_plain.data() + cut);
    stepwise_ok = steps.OpenFinish(ByteSpan(data + 4 + n, kTagSize)).ok();
  }
  if (stepwise_ok != st.ok()) __builtin_trap();

  if (!st.ok()) {
    if (st.code() != StatusCode::kDataLoss || st.message().empty()) __builtin_trap();
    return;
  }
  // It opened: it must be exactly the record a sealer with this key makes of its plaintext.
  const size_t n = sealed.size() - kTagSize;
  if (n > 0 && std::memcmp(stepwise_plain.data(), sealed.data(), n) != 0) __builtin_trap();
  RecordSealer sealer(kRecordKey);
  RawBuffer out;
  sealer.Begin(n, out);
  sealer.Update(ByteSpan(sealed.data(), n), out);
  sealer.Finish(out);
  if (out.size() != size || std::memcmp(out.data(), data, size) != 0) __builtin_trap();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ByteSpan in(data, size);
  CheckHello(in);
  CheckAuth(in);
  CheckVerdict(in);
  CheckRecord(data, size);
  return 0;
}
