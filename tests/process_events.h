// The next JSON event line ({"event": ...}) of a `colony` process a test runs, skipping other
// output; on failure the error carries the tail of the process's log.
#pragma once

#include <chrono>
#include <nlohmann/json.hpp>
#include <string>

#include "test_support.h"

namespace colony::test {

inline Result<nlohmann::json> NextEvent(ProcessGroup& group, const std::string& label,
                                        std::chrono::milliseconds timeout) {
  for (;;) {
    auto line = group[label].ReadLine(timeout);
    if (!line.ok()) return line.status().WithContext(group.Tail(label));
    nlohmann::json j = nlohmann::json::parse(*line, nullptr, false);
    if (j.is_object() && j.contains("event")) return j;
  }
}

}  // namespace colony::test
