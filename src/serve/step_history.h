// StepHistory: the inputs one server's KV cache holds, kept by an inference session's client so
// that it can replay them to a replacement when the server dies ([B, length, H] hidden states).
//
// A step rolls the history back to its position, reorders its rows by the step's hypo_ids (beam
// search) and appends the step's tokens, as the server does to its cache. The tokens are copied
// into storage with room for more (doubled when full, never past the session's max_length), so
// a greedy or sampling step copies its own tokens instead of the whole history: concatenating
// anew at every step (what Petals' client does) costs O(length) per step, e.g. 64 MiB per
// server and token for a 2048-token float32 history of hidden size 8192. A beam search step's
// reorder still copies the history's rows once (as the servers' caches copy theirs).
//
//   StepHistory h(/*max_length=*/128);
//   h.Advance(/*position=*/0, /*hypo_ids=*/{}, prompt_hidden);  // [B, T, H]
//   h.Advance(h.length(), {}, next_token_hidden);               // [B, 1, H]
//   at::Tensor replay = h.tensor();                              // [B, T + 1, H]
#pragma once

#include <ATen/Tensor.h>

#include <cstdint>
#include <utility>

namespace colony::serve {

class StepHistory {
 public:
  // max_length > 0 caps the storage's growth (a session never holds more positions).
  explicit StepHistory(int64_t max_length = 0) : max_length_(max_length) {}
  // One owner per storage: a copy appending in place would overwrite the other's positions.
  StepHistory(const StepHistory&) = delete;
  StepHistory& operator=(const StepHistory&) = delete;
  // A moved-from history is empty.
  StepHistory(StepHistory&& other) noexcept { *this = std::move(other); }
  StepHistory& operator=(StepHistory&& other) noexcept {
    max_length_ = other.max_length_;
    room_ = std::move(other.room_);
    other.room_.reset();
    length_ = std::exchange(other.length_, 0);
    owned_ = std::exchange(other.owned_, false);
    return *this;
  }

  // Keeps positions [0, position) (position <= length()), then rows hypo_ids ([B] int64, may be
  // undefined) in that order, then appends x [B, T, H]. Position 0 starts afresh. An x of another
  // dtype, batch or hidden size than the history holds is concatenated as at::cat would.
  void Advance(int64_t position, const at::Tensor& hypo_ids, const at::Tensor& x);
  // Replaces the history by h [B, T, H] (a replacement server's replayed inputs). h is not
  // copied: it is copied only when a later step would write into its positions.
  void Assign(const at::Tensor& h);

  // [B, length, H], a view of the storage (undefined while empty): valid until the next change.
  at::Tensor tensor() const;
  int64_t length() const { return length_; }
  // Positions the storage holds without growing.
  int64_t capacity() const;

 private:
  // Storage of at least `positions` positions that this history alone writes, holding its
  // first `keep` positions (rows reordered by `rows` when defined).
  void Rehome(int64_t positions, int64_t keep, const at::Tensor& rows);

  int64_t max_length_ = 0;
  at::Tensor room_;     // [B, capacity, H]; positions >= length_ are unused
  int64_t length_ = 0;  // positions held
  bool owned_ = false;  // whether room_ was allocated here (not a caller's tensor)
};

}  // namespace colony::serve
