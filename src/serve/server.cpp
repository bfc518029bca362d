// The block server's life (server_internal.h lists its files): start (load, measure, announce,
// register the RPCs), stop, stats, and serve.info.
#include "serve/server.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>

#include "core/log.h"
#include "net/source_address.h"
#include "serve/server_internal.h"

namespace colony::serve {

const std::vector<DType> kFloatDTypes = {DType::kFloat32, DType::kBFloat16, DType::kFloat16};

namespace {

// `share` of `limit`, at least 1 (a share outside (0, 1] is refused by Init).
uint64_t Share(uint64_t limit, double share) {
  if (!(share > 0 && share < 1)) return limit;
  return std::max<uint64_t>(1, static_cast<uint64_t>(share * static_cast<double>(limit)));
}

}  // namespace

std::string Hex(std::string_view bytes) {
  std::string out;
  for (unsigned char c : bytes.substr(0, 4)) out += fmt::format("{:02x}", c);
  return out;
}

BlockServer::Impl::Impl(dht::Node& node, ServerOptions options)
    : node_(node),
      options_(std::move(options)),
      // Each session has at most one step queued: its slots are kept from forward and backward
      // requests, which a client could otherwise queue until every session's step is refused.
      pool_({.threads = 1,
             .max_queued = options_.max_queued_tasks + options_.max_sessions,
             .reserved_urgent = options_.max_sessions,
             .thread_init =
                 [t = options_.torch_threads] {
                   if (t > 0) at::set_num_threads(t);
                 }}),
      queued_requests_(
          {.limit = options_.max_queued_tasks,
           .per_source = Share(options_.max_queued_tasks, options_.request_share_per_address),
           .unit = "forward and backward requests"}),
      held_request_bytes_(
          {.limit = options_.max_request_bytes,
           .per_source = Share(options_.max_request_bytes, options_.request_share_per_address),
           .unit = "bytes of forward and backward requests"}) {}

Status BlockServer::Impl::Init() {
  COLONY_ASSIGN_OR_RETURN(dtype_, ParseDType(options_.dtype));
  COLONY_ASSIGN_OR_RETURN(device_, model::ParseDevice(options_.device));
  COLONY_ASSIGN_OR_RETURN(quantization_, model::ParseWeightQuantization(options_.quantize));
  if (!(options_.cache_share_per_address > 0 && options_.cache_share_per_address <= 1) ||
      options_.max_sessions_per_address == 0) {
    return InvalidArgument(fmt::format(
        "cache_share_per_address {} must be in (0, 1] and max_sessions_per_address {} at least 1",
        options_.cache_share_per_address, options_.max_sessions_per_address));
  }
  if (!(options_.request_share_per_address > 0 && options_.request_share_per_address <= 1) ||
      options_.max_request_bytes == 0) {
    return InvalidArgument(fmt::format(
        "request_share_per_address {} must be in (0, 1] and max_request_bytes {} at least 1",
        options_.request_share_per_address, options_.max_request_bytes));
  }
  if (options_.ping_timeout.count() <= 0) {
    return InvalidArgument(
        fmt::format("ping_timeout must be positive, not {} ms", options_.ping_timeout.count()));
  }
  COLONY_ASSIGN_OR_RETURN(config_, model::LoadLlamaConfig(options_.model_dir));
  if (options_.model_name.empty()) {
    options_.model_name = std::filesystem::absolute(options_.model_dir).filename().string();
    if (options_.model_name.empty()) {
      options_.model_name =
          std::filesystem::absolute(options_.model_dir).parent_path().filename().string();
    }
  }
  max_length_ = options_.max_length > 0 ? std::min(options_.max_length, config_.max_seq_len)
                                        : config_.max_seq_len;
  const int64_t n = config_.num_layers;
  if (options_.first_block >= 0 || options_.last_block >= 0) {
    first_ = options_.first_block;
    last_ = options_.last_block;
    pinned_ = true;
  } else {
    const int64_t count = options_.num_blocks > 0 ? std::min(options_.num_blocks, n) : n;
    first_ = ChooseBestStart(PlacementCoverage(0), count);
    last_ = first_ + count;
  }
  if (first_ < 0 || last_ <= first_ || last_ > n) {
    return InvalidArgument(fmt::format(
        "blocks [{}, {}) are not a range of the model's {} blocks; use --blocks A:B with "
        "0 <= A < B <= {}",
        first_, last_, n, n));
  }
  if (options_.make_training) {
    if (!pinned_ || dtype_ != at::kFloat || options_.quantize != "none" || !device_.is_cpu()) {
      return InvalidArgument(
          "a server that trains its blocks needs pinned blocks (--blocks A:B), float32, no "
          "quantization and the CPU");
    }
    options_.rebalance = false;
  }
  SetState(ServerState::kJoining);
  Announce();
  COLONY_RETURN_IF_ERROR(LoadBlocks(first_, last_));
  if (options_.make_training) {
    std::vector<at::Tensor> params;
    for (auto& b : blocks_) {
      for (auto& p : b->parameters()) {
        p.set_requires_grad(true);
        params.push_back(p);
      }
    }
    COLONY_ASSIGN_OR_RETURN(training_, options_.make_training(std::move(params)));
  }
  MeasureThroughput();
  SetState(ServerState::kOnline);
  Announce();
  RegisterHandlers();
  announcer_ = std::thread([this] { AnnounceLoop(); });
  COLONY_LOG_INFO("serving blocks [{}, {}) of {} ({} on {}, {:.0f} tokens/s per block) as {}",
                  first_, last_, options_.model_name, DTypeLabel(dtype_), device_.str(),
                  throughput_, node_.peer_id().ToString());
  return Status();
}

void BlockServer::Impl::Shutdown() {
  {
    std::lock_guard lock(mu_);
    if (stopped_) return;
    stopped_ = true;
  }
  cv_.notify_all();
  if (announcer_.joinable()) announcer_.join();
  SetState(ServerState::kOffline);
  Announce();
  std::vector<std::shared_ptr<Session>> sessions;
  {
    std::lock_guard lock(mu_);
    for (auto& [id, s] : sessions_) sessions.push_back(s);
  }
  for (auto& s : sessions) s->channel->close();
  pool_.Shutdown();
}

ServerStats BlockServer::Impl::Stats() const {
  std::lock_guard lock(mu_);
  ServerStats s;
  s.first = first_;
  s.last = last_;
  s.state = state_;
  s.throughput = throughput_;
  s.inference_rps = inference_rps_;
  s.weight_bytes = weight_bytes_;
  s.cache_bytes_total = options_.cache_bytes;
  s.cache_bytes_used = cache_used_;
  s.sessions = sessions_.size();
  s.steps = steps_;
  s.pushes_used = pushes_used_;
  s.duplicates = duplicates_;
  s.forwards = forwards_;
  s.backwards = backwards_;
  s.requests_held = queued_requests_.used();
  s.request_bytes_held = held_request_bytes_.used();
  s.requests_refused = queued_requests_.refused() + held_request_bytes_.refused();
  return s;
}

void BlockServer::Impl::SetState(ServerState state) {
  std::lock_guard lock(mu_);
  state_ = state;
}

void BlockServer::Impl::RegisterHandlers() {
  auto self = shared_from_this();
  auto& host = node_.host();
  host.RegisterUnary("serve.info",
                     [self](net::CallContext&, net::Message) { return self->Info(); });
  host.RegisterUnary("serve.forward", [self](net::CallContext& ctx, net::Message m) {
    return self->Forward(net::SourceKey(ctx, self->options_.limit_loopback_addresses), std::move(m),
                         /*backward=*/false);
  });
  host.RegisterUnary("serve.backward", [self](net::CallContext& ctx, net::Message m) {
    return self->Forward(net::SourceKey(ctx, self->options_.limit_loopback_addresses), std::move(m),
                         /*backward=*/true);
  });
  host.RegisterBidiStreaming("serve.inference",
                             [self](net::CallContext& ctx) { return self->Inference(ctx); });
  host.RegisterUnary("serve.push", [self](net::CallContext& ctx, net::Message m) {
    return self->Push(ctx.peer(), std::move(m));
  });
  host.RegisterUnary("serve.fence", [self](net::CallContext&, net::Message m) {
    return self->Fence(std::move(m));
  });
}

Status BlockServer::Impl::CheckServing() const {
  std::lock_guard lock(mu_);
  if (stopped_) return Unavailable("the server is shutting down; use another server");
  if (state_ != ServerState::kOnline) {
    return Unavailable("the server is not online (loading or moving blocks); retry later");
  }
  return Status();
}

// Checked again on the compute thread: the blocks may have moved since the request arrived.
bool BlockServer::Impl::Holds(int64_t start, int64_t end) const {
  std::lock_guard lock(mu_);
  return first_ <= start && end <= last_;
}

Status BlockServer::Impl::MovedError() const {
  return Unavailable("this server moved to other blocks (rebalancing); route the request again");
}

Status BlockServer::Impl::CheckRange(int64_t start, int64_t end) const {
  if (start >= end) {
    return InvalidArgument(fmt::format("blocks [{}, {}) is an empty range", start, end));
  }
  std::lock_guard lock(mu_);
  if (start < first_ || end > last_) {
    // Unavailable, not InvalidArgument: the client may have routed on a stale record.
    return Unavailable(
        fmt::format("blocks [{}, {}) requested; this server holds [{}, {}); route again", start,
                    end, first_, last_));
  }
  return Status();
}

asio::awaitable<Result<net::Message>> BlockServer::Impl::Info() {
  InfoReply info;
  {
    std::lock_guard lock(mu_);
    info.model = options_.model_name;
    info.start = first_;
    info.end = last_;
    info.state = std::string(StateName(state_));
    info.throughput = throughput_;
    info.inference_steps_per_second = inference_rps_;
    info.cache_tokens_left = static_cast<uint64_t>(CacheTokensLeftLocked());
    info.cache_bytes_left = static_cast<uint64_t>(options_.cache_bytes - cache_used_);
    info.active_sessions = static_cast<uint32_t>(sessions_.size());
    info.weight_bytes = static_cast<uint64_t>(weight_bytes_);
  }
  info.version = COLONY_VERSION_STRING;
  info.dtype = DTypeLabel(dtype_);
  info.quantization = options_.quantize;
  info.max_batch = options_.max_batch;
  info.max_length = max_length_;
  info.hidden_size = config_.hidden_size;
  co_return net::Message(EncodeInfo(info));
}

Result<std::unique_ptr<BlockServer>> BlockServer::Start(dht::Node& node, ServerOptions options) {
  auto impl = std::make_shared<Impl>(node, std::move(options));
  COLONY_RETURN_IF_ERROR(impl->Init());
  return std::unique_ptr<BlockServer>(new BlockServer(std::move(impl)));
}

BlockServer::~BlockServer() { Shutdown(); }
void BlockServer::Shutdown() { impl_->Shutdown(); }
ServerStats BlockServer::Stats() const { return impl_->Stats(); }
const model::LlamaConfig& BlockServer::config() const { return impl_->config(); }
const std::string& BlockServer::model_name() const { return impl_->model_name(); }

}  // namespace colony::serve
