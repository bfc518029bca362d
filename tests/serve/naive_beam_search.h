// An independent beam search for tests: the serve tests and the API's process tests compare
// serve::BeamSearch and the API's beams with it.
#pragma once

#include <ATen/ATen.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "model/llama.h"
#include "serve/generation.h"

namespace colony::serve::test {

// An independent beam search: every candidate scored by a full forward pass of the local model
// over its whole sequence (no KV cache, no backend, no row reordering), keeping the `width` best
// of all extensions at each step. Without an end-of-sequence token that is what beam search is.
// A repetition penalty p scales the log-probability of each token already in the sequence by p
// (they are negative), as transformers' processor does to its beam search's scores.
inline std::vector<Beam> NaiveBeamSearch(model::LlamaModel& m, const std::vector<int64_t>& prompt,
                                         size_t width, int steps, double repetition_penalty = 1.0) {
  std::vector<Beam> beams(1);
  at::NoGradGuard no_grad;
  for (int step = 0; step < steps; ++step) {
    std::vector<Beam> next;
    for (const Beam& b : beams) {
      std::vector<int64_t> seq = prompt;
      seq.insert(seq.end(), b.tokens.begin(), b.tokens.end());
      const at::Tensor logits = m->forward(at::tensor(seq, at::kLong).unsqueeze(0));
      const at::Tensor logp = at::log_softmax(logits[0][-1].to(at::kDouble), -1).contiguous();
      const double* lp = logp.data_ptr<double>();
      for (int64_t v = 0; v < logp.size(0); ++v) {
        Beam c = b;
        c.tokens.push_back(v);
        const bool repeated = std::find(seq.begin(), seq.end(), v) != seq.end();
        c.log_prob = b.log_prob + (repeated && lp[v] < 0 ? lp[v] * repetition_penalty : lp[v]);
        next.push_back(std::move(c));
      }
    }
    std::stable_sort(next.begin(), next.end(),
                     [](const Beam& x, const Beam& y) { return x.log_prob > y.log_prob; });
    next.resize(std::min(width, next.size()));
    beams = std::move(next);
  }
  return beams;
}

}  // namespace colony::serve::test
