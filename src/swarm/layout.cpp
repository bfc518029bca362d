// The run's stages (layout.h): swarm.json next to the initial checkpoint.
#include "swarm/layout.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>

namespace colony::swarm {

std::optional<size_t> StageLayout::Find(int64_t first, int64_t last) const {
  for (size_t i = 0; i < stages.size(); ++i) {
    if (stages[i].first == first && stages[i].second == last) return i;
  }
  return std::nullopt;
}

std::string StageLayout::ToString() const {
  std::string out;
  for (const auto& [a, b] : stages) out += fmt::format("{}{}:{}", out.empty() ? "" : ",", a, b);
  return out;
}

Result<StageLayout> EvenLayout(int64_t num_blocks, int64_t count) {
  if (count < 1 || count > num_blocks) {
    return InvalidArgument(fmt::format("{} stages for a model of {} blocks: use between 1 and {}",
                                       count, num_blocks, num_blocks));
  }
  StageLayout layout;
  int64_t first = 0;
  for (int64_t i = 0; i < count; ++i) {
    const int64_t last = first + num_blocks / count + (i < num_blocks % count ? 1 : 0);
    layout.stages.emplace_back(first, last);
    first = last;
  }
  return layout;
}

Status WriteLayout(const std::filesystem::path& model_dir, const StageLayout& layout) {
  nlohmann::json stages = nlohmann::json::array();
  for (const auto& [a, b] : layout.stages) stages.push_back({a, b});
  const auto path = model_dir / kLayoutFile;
  std::ofstream out(path);
  out << nlohmann::json{{"stages", stages}}.dump(1) << "\n";
  out.close();
  if (!out) return Internal(fmt::format("could not write {}", path.string()));
  return Status::Ok();
}

Result<StageLayout> ReadLayout(const std::filesystem::path& model_dir, int64_t num_blocks) {
  const auto path = model_dir / kLayoutFile;
  std::ifstream in(path);
  if (!in) {
    return NotFound(fmt::format(
        "{} is missing: the run's stages are written by 'colony swarm-train init --stages N' "
        "(or write {{\"stages\": [[0, 4], [4, 8]]}} yourself)",
        path.string()));
  }
  std::stringstream text;
  text << in.rdbuf();
  const auto bad = [&](const std::string& why) {
    return InvalidArgument(fmt::format("{}: {}", path.string(), why));
  };
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) return bad("not a JSON object");
  for (const auto& [key, value] : j.items()) {
    if (key != "stages") return bad(fmt::format("unknown field '{}'", key));
  }
  if (!j.contains("stages") || !j["stages"].is_array() || j["stages"].empty()) {
    return bad("\"stages\" must be a non-empty array of [first, last) block ranges");
  }
  StageLayout layout;
  int64_t next = 0;
  for (const auto& s : j["stages"]) {
    if (!s.is_array() || s.size() != 2 || !s[0].is_number_integer() || !s[1].is_number_integer()) {
      return bad(fmt::format("stage {} is not a pair of block indices", s.dump()));
    }
    const int64_t a = s[0].get<int64_t>(), b = s[1].get<int64_t>();
    if (a != next || b <= a || b > num_blocks) {
      return bad(fmt::format(
          "stage [{}, {}) does not continue the stages before it (the stages must tile the "
          "model's {} blocks in order, starting at 0)",
          a, b, num_blocks));
    }
    layout.stages.emplace_back(a, b);
    next = b;
  }
  if (next != num_blocks) {
    return bad(fmt::format("the stages end at block {}, the model has {}", next, num_blocks));
  }
  return layout;
}

}  // namespace colony::swarm
