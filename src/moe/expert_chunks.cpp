#include "moe/expert_chunks.h"

#include <ATen/ATen.h>
#include <fmt/format.h>

#include <algorithm>

#include "runtime/tensor_io.h"

namespace colony::moe {

Result<std::vector<net::Message>> ChunkRows(const std::string& meta,
                                            const std::vector<at::Tensor>& tensors) {
  if (tensors.empty()) return InvalidArgument("an expert call carries at least one tensor");
  const int64_t rows = tensors[0].dim() == 2 ? tensors[0].size(0) : -1;
  uint64_t row_bytes = 0;
  for (const auto& t : tensors) {
    if (t.dim() != 2 || t.size(0) != rows) {
      return InvalidArgument("an expert call's tensors must be 2-D with the same rows");
    }
    row_bytes += static_cast<uint64_t>(t.size(1)) * t.element_size();
  }
  const auto per_chunk = static_cast<int64_t>(
      std::max<uint64_t>(1, kExpertChunkBytes / std::max<uint64_t>(1, row_bytes)));
  std::vector<net::Message> out;
  for (int64_t start = 0; start < rows || out.empty(); start += per_chunk) {
    const int64_t n = std::min(per_chunk, rows - start);
    net::Message m(out.empty() ? meta : std::string());
    for (const auto& t : tensors) {
      COLONY_ASSIGN_OR_RETURN(auto frame, runtime::ToFrame(t.narrow(0, start, n)));
      m.tensors.push_back(std::move(frame));
    }
    out.push_back(std::move(m));
  }
  return out;
}

}  // namespace colony::moe
