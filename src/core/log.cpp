#include "core/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>

#include <cstdlib>
#include <mutex>
#include <string>

namespace colony {

Status InitLogging(std::string_view level) {
  static std::once_flag once;
  std::call_once(once, [] {
    auto logger = spdlog::stderr_color_mt("colony");
    logger->set_pattern("%Y-%m-%d %H:%M:%S.%e %^%l%$ [%P] %v");
    spdlog::set_default_logger(logger);
  });
  std::string name(level);
  std::string source = "log level";
  if (name.empty()) {
    const char* env = std::getenv("COLONY_LOG");
    if (env && *env) source = "log level in COLONY_LOG";
    name = env && *env ? env : "info";
  }
  auto lvl = spdlog::level::from_str(name);
  // from_str maps unknown names to "off"; only accept "off" when asked for explicitly.
  if (lvl == spdlog::level::off && name != "off") {
    spdlog::set_level(spdlog::level::info);
    return InvalidArgument("unknown " + source + " '" + name +
                           "'; use one of trace, debug, info, warn, error, critical, off");
  }
  spdlog::set_level(lvl);
  return Status::Ok();
}

}  // namespace colony
