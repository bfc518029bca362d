// State sharing: newcomers download the current state (e.g. parameters and optimizer
// statistics) from peers that already have it.
//
// A donor advertises itself under "<prefix>.state" (subkey: its owner marker; value: its
// addresses and a priority such as its epoch), refreshing the advert while it shares. A newcomer
// reads the adverts, orders donors by priority (highest first; equal priorities in random order,
// so that many newcomers spread over many donors rather than all hitting one — hivemind#169), and
// asks them one at a time over a server-streaming "avg.state" call: a header (metadata, tensor
// sizes) and then the values in chunks of state_chunk_bytes. A donor serves at most
// max_concurrent_state_transfers downloads at once, max_state_transfers_per_address of them to one
// address, and refuses more, so the newcomer moves on to the next donor; a donor that fails
// mid-transfer is skipped the same way. A caller that stops giving credit has its download cut
// by the transport (ConnectionOptions::send_stall_timeout), so it cannot hold a slot by not
// reading. Every size is checked against the header before any value is copied. A loader whose
// donors should agree (LoadStateOptions::same_version) asks other donors for the SHA-256 digest
// of their state (a digest_only request: the header and the digest, no values) and refuses a
// download that more of them contradict than confirm; each of those asks has a share of the time
// left. A donor must send a download's header within half the time left, so a silent donor costs
// that half.
#include <fmt/format.h>
#include <fmt/ranges.h>  // fmt::join (in fmt/format.h only before fmt 11)
#include <sodium.h>

#include <algorithm>
#include <cstring>
#include <random>

#include "averaging/internal.h"
#include "dht/validation.h"
#include "net/source_address.h"

namespace colony::averaging {

namespace {

std::string StateKey(const std::string& prefix) { return prefix + ".state"; }

// SHA-256 of a state's values as they go on the wire (float32, in order).
std::string StateDigest(const SharedState& state) {
  crypto_hash_sha256_state st;
  crypto_hash_sha256_init(&st);
  for (const auto& t : state.tensors) {
    crypto_hash_sha256_update(&st, reinterpret_cast<const unsigned char*>(t.data()),
                              t.size() * sizeof(float));
  }
  std::string out(kStateDigestBytes, '\0');
  crypto_hash_sha256_final(&st, reinterpret_cast<unsigned char*>(out.data()));
  return out;
}

// Cancels `stream` at `deadline` unless disarmed first (or destroyed): a donor must send its
// state's header within a share of the time left, so one that accepts the call and stays silent
// costs that share, not the whole load.
class HeaderWatchdog {
 public:
  HeaderWatchdog(const IoStrand& strand, const std::shared_ptr<net::Stream>& stream,
                 SteadyTime deadline)
      : timer_(strand, deadline) {
    std::weak_ptr<net::Stream> weak = stream;
    timer_.async_wait([weak](const std::error_code& ec) {
      if (ec) return;  // disarmed
      if (auto s = weak.lock()) {
        s->Cancel(DeadlineExceeded("the donor sent no state header within its share of the time"));
      }
    });
  }
  ~HeaderWatchdog() { timer_.cancel(); }
  HeaderWatchdog(const HeaderWatchdog&) = delete;
  HeaderWatchdog& operator=(const HeaderWatchdog&) = delete;
  void Disarm() { timer_.cancel(); }

 private:
  asio::steady_timer timer_;
};

}  // namespace

void Averager::Impl::ShareState(StateProvider provider, double priority) {
  bool start = false;
  {
    std::lock_guard lock(state_mu_);
    provider_ = std::move(provider);
    priority_ = priority;
    start = provider_ && !advertising_;
    if (start) advertising_ = true;
  }
  if (start) {
    auto self = shared_from_this();
    auto loop = [self]() -> asio::awaitable<void> { co_await self->AdvertiseLoop(); };
    asio::co_spawn(strand_, std::move(loop), asio::detached);
  } else {
    ReadvertiseSoon();  // with the new priority
  }
}

void Averager::Impl::SetStatePriority(double priority) {
  {
    std::lock_guard lock(state_mu_);
    if (priority_ == priority) return;
    priority_ = priority;
  }
  ReadvertiseSoon();
}

void Averager::Impl::ReadvertiseSoon() {
  // The timer belongs to the strand: cancel it there, so newcomers see the new priority now
  // rather than a state_advert_period later.
  auto self = shared_from_this();
  asio::post(strand_, [self] {
    if (self->advert_timer_ != nullptr) self->advert_timer_->cancel();
  });
}

asio::awaitable<void> Averager::Impl::AdvertiseLoop() {
  asio::steady_timer timer(strand_);
  advert_timer_ = &timer;
  struct Reset {
    asio::steady_timer*& timer;
    ~Reset() { timer = nullptr; }
  } reset{advert_timer_};
  for (;;) {
    double priority = 0;
    {
      std::lock_guard lock(state_mu_);
      if (!provider_ || shut_down_) {
        advertising_ = false;
        co_return;
      }
      priority = priority_;
    }
    StateAdvert advert;
    for (const auto& a : node_.VisibleAddresses()) {
      if (advert.addrs.size() < kMaxAddrs) advert.addrs.push_back(a.ToString());
    }
    advert.priority = priority;
    if (!advert.addrs.empty()) {
      const double ttl = 2.5 * Seconds(options_.state_advert_period);
      std::string key = StateKey(options_.prefix), value = EncodeStateAdvert(advert);
      std::optional<std::string> subkey = dht::OwnerMarker(host_.peer_id());
      Status st = co_await node_.Store(std::move(key), std::move(value), dht::Now() + ttl,
                                       std::move(subkey));
      if (!st.ok()) COLONY_LOG_DEBUG("averaging: state advert failed: {}", st.ToString());
    }
    if (shut_down_) {
      std::lock_guard lock(state_mu_);
      advertising_ = false;
      co_return;
    }
    timer.expires_after(options_.state_advert_period);
    co_await timer.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
  }
}

asio::awaitable<Status> Averager::Impl::HandleStateRequest(net::CallContext& ctx,
                                                           net::Message request) {
  auto req = DecodeStateRequest(request.meta);
  if (!req.ok()) co_return req.status();
  if (req->prefix != options_.prefix) co_return NotFound("no state is shared under " + req->prefix);
  const std::string source = net::SourceKey(ctx, host_.limits_loopback());
  StateProvider provider;
  {
    std::lock_guard lock(state_mu_);
    if (!provider_) co_return Unavailable("this peer does not share its state");
    if (req->min_priority && priority_ < *req->min_priority) {
      co_return Unavailable(
          fmt::format("this donor's state has priority {}, below the {} asked for", priority_,
                      *req->min_priority));
    }
    if (transfers_in_flight_ >= options_.max_concurrent_state_transfers) {
      co_return Unavailable(fmt::format(
          "this donor is busy ({} downloads in flight); try another donor", transfers_in_flight_));
    }
    const auto held =
        source.empty() ? transfers_by_source_.end() : transfers_by_source_.find(source);
    const size_t from_source = held == transfers_by_source_.end() ? 0 : held->second;
    if (!source.empty() && from_source >= options_.max_state_transfers_per_address) {
      co_return Unavailable(fmt::format(
          "this donor already serves {} download(s) to your address {}, its limit per address; "
          "try another donor",
          from_source, source.substr(0, 64)));
    }
    ++transfers_in_flight_;
    if (!source.empty()) ++transfers_by_source_[source];
    provider = provider_;
  }
  struct Release {
    Impl* impl;
    std::string source;
    ~Release() {
      std::lock_guard lock(impl->state_mu_);
      --impl->transfers_in_flight_;
      if (!source.empty() && --impl->transfers_by_source_[source] == 0) {
        impl->transfers_by_source_.erase(source);
      }
    }
  } release{this, source};

  auto take = [provider]() { return provider(); };
  auto snapshot = co_await RunOn<Result<SharedState>>(PoolExecutor(), std::move(take));
  if (!snapshot.ok()) co_return snapshot.status().WithContext("taking a state snapshot");
  StateHeader header;
  header.metadata = snapshot->metadata;
  if (header.metadata.size() > kMaxStateMetadataBytes) {
    co_return Internal("the state's metadata exceeds 1 MiB");
  }
  for (const auto& t : snapshot->tensors) header.tensor_sizes.push_back(t.size());
  if (req->digest_only) {
    auto state = std::make_shared<SharedState>(std::move(*snapshot));
    auto hash = [state]() { return StateDigest(*state); };
    header.digest = co_await RunOn<std::string>(PoolExecutor(), std::move(hash));
    co_return co_await ctx.stream().Write(net::Message(EncodeStateHeader(header)));
  }
  const net::Message header_message(EncodeStateHeader(header));
  Status st = co_await ctx.stream().Write(header_message);
  if (!st.ok()) co_return st;
  // Chunks of float32 values that may span tensors; the state stays alive until written.
  auto state = std::make_shared<SharedState>(std::move(*snapshot));
  const size_t chunk_values = std::max<size_t>(1, options_.state_chunk_bytes / sizeof(float));
  // Uploads are paced like the all-reduce's (max_send_rate), so a volunteer's link stays usable.
  asio::steady_timer pace(co_await asio::this_coro::executor);
  SteadyTime next_send = SteadyNow();
  for (const auto& t : state->tensors) {
    for (size_t at = 0; at < t.size(); at += chunk_values) {
      const size_t n = std::min(chunk_values, t.size() - at);
      if (options_.max_send_rate > 0) {
        if (next_send > SteadyNow()) {
          pace.expires_at(next_send);
          co_await pace.async_wait(asio::experimental::as_tuple(asio::use_awaitable));
          if (co_await CoroCancelled()) co_return Cancelled("the download was cancelled");
        }
        next_send = std::max(next_send, SteadyNow()) +
                    std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                        std::chrono::duration<double>(static_cast<double>(n * sizeof(float)) /
                                                      options_.max_send_rate));
      }
      net::Message m;
      net::TensorFrame f;
      f.dtype = DType::kFloat32;
      f.shape = {static_cast<int64_t>(n)};
      f.data = ByteSpan(reinterpret_cast<const uint8_t*>(t.data() + at), n * sizeof(float));
      f.owner = state;
      m.tensors.push_back(std::move(f));
      st = co_await ctx.stream().Write(m);
      if (!st.ok()) co_return st;
    }
  }
  co_return Status();
}

asio::awaitable<Result<StateHeader>> Averager::Impl::RequestState(net::Stream& stream,
                                                                  StateRequest request) {
  const net::Message message(EncodeStateRequest(request));
  COLONY_CO_RETURN_IF_ERROR(co_await stream.Write(message));
  COLONY_CO_RETURN_IF_ERROR(co_await stream.CloseWrite());
  auto first = co_await stream.Read();
  if (!first.ok()) co_return first.status();
  if (!first->has_value()) co_return ProtocolError("the donor sent no state header");
  co_return DecodeStateHeader((*first)->meta);
}

asio::awaitable<Result<StateHeader>> Averager::Impl::AskDigest(const PeerId& peer,
                                                               const Multiaddr& addr,
                                                               std::optional<double> min_priority,
                                                               SteadyTime deadline) {
  std::string method = MethodName("state");
  net::CallOptions call_options{.timeout = MsUntil(deadline)};
  auto stream = co_await host_.OpenStream(addr, std::move(method), call_options);
  if (!stream.ok()) co_return stream.status();
  auto s = *stream;
  auto ask = [&]() -> asio::awaitable<Result<StateHeader>> {
    // (g++ 12: no temporaries in an expression that also co_awaits.)
    StateRequest request{options_.prefix, min_priority, true};
    auto header = co_await RequestState(*s, std::move(request));
    if (!header.ok()) co_return header.status();
    if (header->digest.size() != kStateDigestBytes) {
      co_return ProtocolError("the donor answered a digest request without a digest");
    }
    auto end = co_await s->Read();
    if (!end.ok()) co_return end.status();
    if (end->has_value()) co_return ProtocolError("the donor sent more than a digest");
    co_return header;
  };
  auto header = co_await ask();
  if (!header.ok()) {
    s->Cancel(header.status());
    COLONY_LOG_DEBUG("averaging: no state digest from {}: {}", peer.ToString(),
                     header.status().ToString());
  }
  co_return header;
}

asio::awaitable<Status> Averager::Impl::CrossCheck(const SharedState& state, const PeerId& from,
                                                   const std::vector<StateDonor>& donors,
                                                   const LoadStateOptions& options,
                                                   SteadyTime deadline) {
  auto hash = [&state]() { return StateDigest(state); };
  const std::string digest = co_await RunOn<std::string>(PoolExecutor(), std::move(hash));
  size_t agree = 0, disagree = 0, comparable = 0;
  std::vector<std::string> contradicted;
  for (const StateDonor& other : donors) {
    if (comparable >= options.confirmations || SteadyNow() >= deadline) break;
    if (other.peer == from) continue;
    // Each ask gets a share of the time left: 1 / (confirmations still wanted + 1). A donor that
    // never answers costs that share, not the whole load, so a liar's silent accomplices cannot
    // run out the clock until its state is taken unconfirmed.
    const size_t wanted = options.confirmations - comparable;
    const SteadyTime ask_deadline =
        SteadyNow() + (deadline - SteadyNow()) / static_cast<int64_t>(wanted + 1);
    auto theirs = co_await AskDigest(other.peer, other.addr, options.min_priority, ask_deadline);
    if (!theirs.ok() || !options.same_version(state.metadata, theirs->metadata)) continue;
    ++comparable;
    if (theirs->digest == digest) {
      ++agree;
    } else {
      ++disagree;
      contradicted.push_back(other.peer.Short());
    }
  }
  if (disagree > agree) {
    co_return DataLoss(fmt::format(
        "its state differs from that of {} other donor(s) of the same version ({}), and {} "
        "confirmed it",
        disagree, fmt::join(contradicted, ", "), agree));
  }
  if (comparable > 0) {
    COLONY_LOG_INFO("averaging: the state from {} was confirmed by {} of {} other donor(s)",
                    from.ToString(), agree, comparable);
  }
  co_return Status::Ok();
}

asio::awaitable<Result<SharedState>> Averager::Impl::LoadState(LoadStateOptions options) {
  const SteadyTime deadline = SteadyNow() + options.timeout;
  auto record = co_await node_.Get(StateKey(options_.prefix), dht::Freshness::kLatest);
  if (!record.ok() || !record->is_dict) {
    co_return NotFound("no peer shares state under " + StateKey(options_.prefix) +
                       "; is a peer with the current state running with the same prefix?");
  }
  std::vector<StateDonor> donors;
  const double now = dht::Now();
  for (const auto& [subkey, entry] : record->subkeys) {
    if (entry.expiration <= now) continue;
    auto peer = dht::ParseOwnerMarker(subkey);
    if (!peer || *peer == host_.peer_id()) continue;
    auto advert = DecodeStateAdvert(entry.value);
    if (!advert.ok()) continue;
    auto addr = DialAddress(host_, advert->addrs, *peer);
    if (addr.ok()) donors.push_back({*peer, *addr, advert->priority});
  }
  if (donors.empty()) {
    co_return NotFound("no other peer shares state under " + StateKey(options_.prefix));
  }
  {
    std::lock_guard lock(state_mu_);
    std::shuffle(donors.begin(), donors.end(), rng_);
  }
  std::stable_sort(donors.begin(), donors.end(), [](const StateDonor& a, const StateDonor& b) {
    return a.priority > b.priority;
  });

  std::vector<std::string> failures;
  for (const StateDonor& donor : donors) {
    if (SteadyNow() >= deadline) break;
    std::string method = MethodName("state");
    net::CallOptions call_options{.timeout = MsUntil(deadline)};
    auto stream = co_await host_.OpenStream(donor.addr, std::move(method), call_options);
    auto attempt = [&]() -> asio::awaitable<Result<SharedState>> {
      if (!stream.ok()) co_return stream.status();
      auto s = *stream;
      HeaderWatchdog watchdog(strand_, s, SteadyNow() + (deadline - SteadyNow()) / 2);
      StateRequest request{options_.prefix, options.min_priority};
      auto header = co_await RequestState(*s, std::move(request));
      watchdog.Disarm();
      if (!header.ok()) co_return header.status();
      uint64_t values = 0;
      for (uint64_t size : header->tensor_sizes) values += size;  // bounded by the decoder
      if (values > options.max_values) {
        co_return ProtocolError(
            fmt::format("the donor announced a state of {} values, more than "
                        "the {} this peer accepts",
                        values, options.max_values));
      }
      if (options.check_header) {
        Status st = options.check_header(header->metadata, header->tensor_sizes);
        if (!st.ok()) co_return st.WithContext("the donor's state header was refused");
      }
      SharedState state;
      state.metadata = std::move(header->metadata);
      for (uint64_t size : header->tensor_sizes) {
        std::vector<float> t;
        t.reserve(static_cast<size_t>(std::min<uint64_t>(size, 1u << 24)));
        while (t.size() < size) {
          auto chunk = co_await s->Read();
          if (!chunk.ok()) co_return chunk.status();
          if (!chunk->has_value()) co_return ProtocolError("the state ended early");
          const auto& tensors = (*chunk)->tensors;
          if (tensors.size() != 1 || tensors[0].dtype != DType::kFloat32 || tensors[0].codec != 0) {
            co_return ProtocolError("a state chunk must be one raw float32 tensor");
          }
          const size_t n = tensors[0].data.size() / sizeof(float);
          if (n == 0 || n > size - t.size()) {
            co_return ProtocolError("a state chunk does not fit the announced tensor sizes");
          }
          const size_t at = t.size();
          t.resize(at + n);
          std::memcpy(t.data() + at, tensors[0].data.data(), n * sizeof(float));
        }
        state.tensors.push_back(std::move(t));
      }
      auto end = co_await s->Read();
      if (!end.ok()) co_return end.status();
      if (end->has_value()) co_return ProtocolError("the donor sent more than it announced");
      co_return state;
    };
    auto result = co_await attempt();
    if (result.ok() && options.same_version) {
      Status confirmed = co_await CrossCheck(*result, donor.peer, donors, options, deadline);
      if (!confirmed.ok()) {
        COLONY_LOG_WARN("averaging: the state from {} was refused: {}; trying the next donor",
                        donor.peer.ToString(), confirmed.ToString());
        failures.push_back(donor.peer.Short() + ": " + confirmed.ToString());
        continue;
      }
    }
    if (result.ok()) {
      COLONY_LOG_INFO("averaging: loaded state from {} (priority {})", donor.peer.ToString(),
                      donor.priority);
      co_return result;
    }
    if (stream.ok()) (*stream)->Cancel(result.status());
    if (result.status().code() == StatusCode::kUnavailable) {  // busy, or older than asked for
      COLONY_LOG_DEBUG("averaging: donor {} refused: {}; trying the next donor",
                       donor.peer.ToString(), result.status().ToString());
    } else {
      COLONY_LOG_WARN("averaging: loading state from {} failed: {}; trying the next donor",
                      donor.peer.ToString(), result.status().ToString());
    }
    failures.push_back(donor.peer.Short() + ": " + result.status().ToString());
  }
  co_return Unavailable(fmt::format("could not load state from any of {} donor(s) under {}: {}",
                                    donors.size(), StateKey(options_.prefix),
                                    fmt::join(failures, "; ")));
}

}  // namespace colony::averaging
