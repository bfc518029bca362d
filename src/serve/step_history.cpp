// StepHistory (step_history.h): a session's inputs to one server, appended in place.
#include "serve/step_history.h"

#include <ATen/ATen.h>

#include <algorithm>

namespace colony::serve {
namespace {

// The least room a history starts with: the first decoding steps do not regrow it.
constexpr int64_t kMinRoom = 16;

}  // namespace

int64_t StepHistory::capacity() const { return room_.defined() ? room_.size(1) : 0; }

at::Tensor StepHistory::tensor() const {
  return length_ > 0 ? room_.narrow(1, 0, length_) : at::Tensor();
}

void StepHistory::Assign(const at::Tensor& h) {
  room_ = h;
  length_ = h.defined() ? h.size(1) : 0;
  owned_ = false;
}

void StepHistory::Rehome(int64_t positions, int64_t keep, const at::Tensor& rows) {
  const int64_t batch = rows.defined() ? rows.size(0) : room_.size(0);
  at::Tensor fresh = at::empty({batch, positions, room_.size(2)}, room_.options());
  if (keep > 0) {
    const at::Tensor kept = room_.narrow(1, 0, keep);
    fresh.narrow(1, 0, keep).copy_(rows.defined() ? kept.index_select(0, rows) : kept);
  }
  room_ = std::move(fresh);
  owned_ = true;
}

void StepHistory::Advance(int64_t position, const at::Tensor& hypo_ids, const at::Tensor& x) {
  TORCH_CHECK(x.dim() == 3, "a step's hidden states must be [B, T, H], got ", x.sizes());
  TORCH_CHECK(position >= 0 && position <= length_, "step position ", position, " is outside [0, ",
              length_, "] (the positions held)");
  // Position 0 starts afresh: there are no rows to reorder.
  const at::Tensor rows = position > 0 ? hypo_ids : at::Tensor();
  // The rows the history holds once reordered: x must bring as many.
  const int64_t held = !room_.defined() ? -1 : rows.defined() ? rows.size(0) : room_.size(0);
  const bool fits = x.size(0) == held && x.size(2) == room_.size(2) &&
                    x.scalar_type() == room_.scalar_type() && x.device() == room_.device();
  if (position > 0 && !fits) {  // as at::cat would (and fails where it fails)
    at::Tensor kept = room_.narrow(1, 0, position);
    if (rows.defined()) kept = kept.index_select(0, rows);
    room_ = at::cat({kept, x}, 1);
    length_ = room_.size(1);
    owned_ = true;
    return;
  }
  const int64_t need = position + x.size(1);
  // Doubling keeps the copies of a whole sequence O(length); a session never needs more than
  // its max_length.
  auto grown = [&](int64_t base) {
    int64_t room = std::max({need, 2 * base, kMinRoom});
    if (max_length_ >= need) room = std::min(room, max_length_);
    return room;
  };
  if (!fits) {
    room_ = at::empty({x.size(0), grown(0), x.size(2)}, x.options());
    owned_ = true;
  } else if (need > capacity()) {
    Rehome(grown(capacity()), position, rows);
  } else if (!owned_ || rows.defined()) {
    Rehome(capacity(), position, rows);
  }
  room_.narrow(1, position, x.size(1)).copy_(x);
  length_ = need;
}

}  // namespace colony::serve
