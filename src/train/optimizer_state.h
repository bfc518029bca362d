// Optimizer state as named tensors: what a peer ships to a newcomer and what a checkpoint holds.
// Supported: torch::optim::SGD, Adam, AdamW and Colony's Lamb and Adam8bit (optimizers.h). Each
// type's per-parameter state layout is described once (optimizer_state.cpp); a lookup by the
// optimizer's exact type picks it.
//
//   auto named = ExportOptimizerState(*opt);                // ship to a newcomer ...
//   Status st = ImportOptimizerState(newcomer_opt, named);  // ... which validates and adopts it
#pragma once

#include <torch/optim/optimizer.h>

#include <string>
#include <utility>
#include <vector>

#include "core/status.h"

namespace colony::train {

// The state as named tensors "group<g>.param<i>.<field>", in group and parameter order:
//   SGD:      momentum_buffer (only with momentum, after the first step)
//   Adam(W):  step (int64 scalar), exp_avg, exp_avg_sq, max_exp_avg_sq (with amsgrad)
//   Lamb:     step, exp_avg, exp_avg_sq
//   Adam8bit: step, then exp_avg, exp_avg_sq (float32, small parameters) or exp_avg_codes,
//             exp_avg_sq_codes (flat uint8), exp_avg_absmax, exp_avg_sq_absmax (float32 per block)
// Parameters without state (never stepped) have no entries. The tensors alias the live state
// (no copy, since states can be most of the memory): serialize or clone them before the next
// step. Unsupported optimizer types give an empty list.
std::vector<std::pair<std::string, torch::Tensor>> ExportOptimizerState(
    torch::optim::Optimizer& optimizer);

// Replaces the optimizer's whole state by `state` (as exported by an optimizer of the same type
// over parameters of the same shapes and options that decide the layout: SGD momentum, amsgrad,
// Adam8bit's block_size and min_8bit_size). Parameters without entries end up without state;
// tensors are copied onto the state's device. Everything is validated before anything changes
// (the data may come from an untrusted peer): unknown names, indices out of range, duplicate or
// missing fields, wrong shapes or dtypes, negative steps and non-finite absmaxes are errors
// (InvalidArgument, naming the entry), and leave the optimizer untouched. Unimplemented for
// other optimizer types.
Status ImportOptimizerState(torch::optim::Optimizer& optimizer,
                            const std::vector<std::pair<std::string, torch::Tensor>>& state);

}  // namespace colony::train
