// How an expert call's tensors travel. "moe.forward" and "moe.backward" are streams of messages
// both ways, each message carrying a slice of rows of every tensor of the call, at most
// kExpertChunkBytes of tensor data, so that a batch of any size the server accepts (max_batch
// rows, e.g. 4096 x 4096 floats: 64 MiB per tensor) travels although the transport refuses
// single messages over 64 MiB, and either side holds one chunk at a time in the transport:
//   request: the first message's meta is the expert's id, later ones have none; every message
//            carries 1 (forward: x) or 2 (backward: x, grad_y) tensors with the same rows;
//   reply:   messages of one tensor each, the output's rows in order.
// A small call is one message each way, as a unary call (no extra round trip).
#pragma once

#include <ATen/Tensor.h>

#include <string>
#include <vector>

#include "core/status.h"
#include "net/wire.h"

namespace colony::moe {

inline constexpr uint64_t kExpertChunkBytes = 8ull << 20;

// `tensors` (CPU, 2-D, the same number of rows, any dtype the wire has) cut into messages of
// whole rows, at least one row and at most kExpertChunkBytes of data each (beyond that a single
// row goes alone); the first message carries `meta`. The frames view the tensors (no copy when
// they are contiguous).
Result<std::vector<net::Message>> ChunkRows(const std::string& meta,
                                            const std::vector<at::Tensor>& tensors);

}  // namespace colony::moe
