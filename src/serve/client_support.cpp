// What the client's files share (client_internal.h): addresses and ids, checking servers'
// replies, the tuning tensors of a span, retries.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <sodium.h>

#include <cmath>
#include <thread>

#include "model/finite.h"
#include "runtime/tensor_io.h"
#include "serve/client_internal.h"

namespace colony::serve {
namespace {

const std::vector<DType> kFloatDTypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

}  // namespace

bool IsClientError(const Status& st) { return st.code() == StatusCode::kInvalidArgument; }

Status ServerFailure(Status st) {
  if (st.code() != StatusCode::kInvalidArgument) return st;
  return Unavailable(fmt::format("the server refused the request: {}", st.message()));
}

Status CheckFinite(const at::Tensor& t, std::string_view what) {
  if (!model::AllFinite(t)) {
    return InvalidArgument(fmt::format("{} contain NaN or infinity", what));
  }
  return Status();
}

Result<Multiaddr> AddressOf(const ServerRecord& r) {
  if (r.addresses.empty()) {
    return Unavailable(fmt::format("server {} announced no address", r.peer.ToString()));
  }
  COLONY_ASSIGN_OR_RETURN(Multiaddr addr, Multiaddr::Parse(r.addresses.front()));
  // Dialled as the record's owner: an address that leads to another peer fails the handshake
  // instead of putting that peer in this server's place.
  if (addr.peer_id() && *addr.peer_id() != r.peer) {
    return ProtocolError(fmt::format("server {} announced the address of another peer ({})",
                                     r.peer.ToString(), addr.ToString()));
  }
  return addr.WithPeerId(r.peer);
}

std::string RandomId() {
  std::string id(16, '\0');
  randombytes_buf(id.data(), id.size());
  return id;
}

Result<at::Tensor> HiddenFrom(const net::Message& m, size_t index, at::IntArrayRef shape) {
  if (m.tensors.size() <= index) return ProtocolError("the server's reply lacks a tensor");
  uint64_t n = 1;
  for (auto d : shape) n *= static_cast<uint64_t>(d);
  COLONY_ASSIGN_OR_RETURN(
      at::Tensor t,
      runtime::FromFrame(m.tensors[index],
                         {.max_elements = n,
                          .allowed_dtypes = kFloatDTypes,
                          .rank = static_cast<int>(shape.size()),
                          .allowed_codecs = index == 0 ? CompressedBoundaryCodecs()
                                                       : std::vector<compression::Codec>{}}));
  if (!t.sizes().equals(shape)) {
    return ProtocolError(fmt::format("the server replied with shape {}, expected {}",
                                     fmt::join(t.sizes(), "x"), fmt::join(shape, "x")));
  }
  if (!model::AllFinite(t)) {
    return ProtocolError("the server replied with NaN or infinite values");
  }
  return t;
}

// The tuning metadata of a BlockRequest or an OpenSession.
TuningSpec TuningOf(int64_t prompt_length, const LoraSpec& lora) {
  TuningSpec t;
  t.prompt_length = prompt_length;
  if (lora.rank > 0) {
    t.lora_rank = lora.rank;
    t.lora_targets = lora.targets;
    t.lora_scale = lora.scale;
  }
  return t;
}

// The deep prompts of a span's blocks, from prompts of the blocks from `offset` on.
at::Tensor PromptsOf(const at::Tensor& prompts, int64_t offset, const RouteSpan& span) {
  if (!prompts.defined()) return {};
  return prompts.narrow(0, span.start - offset, span.end - span.start).detach().contiguous();
}

// The request tensors of a span besides hidden (and grad): its deep prompts and its adapters.
void AppendSpanInputs(std::vector<at::Tensor>& tensors, int64_t offset, const RouteSpan& span,
                      const at::Tensor& prompts, const LoraSpec& lora,
                      const std::vector<at::Tensor>& adapters) {
  if (prompts.defined()) tensors.push_back(PromptsOf(prompts, offset, span));
  if (lora.rank > 0) {
    const size_t per_block = 2 * lora.targets.size();
    for (size_t i = static_cast<size_t>(span.start - offset) * per_block;
         i < static_cast<size_t>(span.end - offset) * per_block; ++i) {
      tensors.push_back(adapters[i].detach().contiguous());
    }
  }
}

Status CheckLora(int64_t start, int64_t end, const LoraSpec& lora,
                 const std::vector<at::Tensor>& adapters) {
  // What the servers would refuse as malformed is the caller's error, found before any call.
  if (lora.rank < 0 || lora.rank > kMaxLoraRank) {
    return InvalidArgument(fmt::format("LoRA rank {} is outside [0, {}]", lora.rank, kMaxLoraRank));
  }
  if (lora.rank > 0) {
    if (lora.targets.empty() || lora.targets.size() > kMaxLoraTargets) {
      return InvalidArgument(fmt::format("LoRA needs 1 to {} target projections", kMaxLoraTargets));
    }
    for (size_t i = 0; i < lora.targets.size(); ++i) {
      if (!IsProjection(lora.targets[i])) {
        return InvalidArgument(fmt::format("unknown LoRA projection '{}'", lora.targets[i]));
      }
      for (size_t j = 0; j < i; ++j) {
        if (lora.targets[j] == lora.targets[i]) {
          return InvalidArgument(fmt::format("LoRA projection '{}' listed twice", lora.targets[i]));
        }
      }
    }
    if (!std::isfinite(lora.scale)) return InvalidArgument("the LoRA scale is not finite");
  }
  const size_t want =
      lora.rank > 0 ? 2 * lora.targets.size() * static_cast<size_t>(end - start) : 0;
  if (adapters.size() != want) {
    return InvalidArgument(fmt::format("expected {} LoRA tensors for blocks [{}, {}), got {}", want,
                                       start, end, adapters.size()));
  }
  // Per block and target an A [rank, in] and a B [out, rank], the same shapes in every block.
  // (Whether in and out are the model's is the servers' to say; this client need not know the
  // model's sizes.)
  const size_t per_block = 2 * lora.targets.size();
  for (size_t i = 0; i < adapters.size(); ++i) {
    const at::Tensor& t = adapters[i];
    const bool is_a = i % 2 == 0;
    const std::string& target = lora.targets[(i / 2) % lora.targets.size()];
    const at::Tensor& first = adapters[i % per_block];
    if (!t.defined() || t.dim() != 2 || !t.is_floating_point() ||
        t.size(is_a ? 0 : 1) != lora.rank || !t.sizes().equals(first.sizes())) {
      return InvalidArgument(fmt::format(
          "LoRA {} of {} for block {} must be a floating point [{}] (rank {}, the same in every "
          "block), got [{}]",
          is_a ? "A" : "B", target, start + static_cast<int64_t>(i / per_block),
          is_a ? fmt::format("{}, in", lora.rank) : fmt::format("out, {}", lora.rank), lora.rank,
          t.defined() ? fmt::format("{}", fmt::join(t.sizes(), ", ")) : std::string("undefined")));
    }
    COLONY_RETURN_IF_ERROR(CheckFinite(t, "LoRA adapters"));
  }
  return Status();
}

void Backoff(SequenceManager& m, int attempt) {
  std::this_thread::sleep_for(m.options().retry_backoff * std::min(attempt, 8));
}

}  // namespace colony::serve
