// Logging through spdlog. The level comes from, in order: an explicit InitLogging(level) call
// (the CLI's --log-level flag), the COLONY_LOG environment variable, or "info".
// Levels: trace, debug, info, warn, error, critical, off. Logs go to stderr.
#pragma once

#include <spdlog/spdlog.h>

#include <string_view>

#include "core/status.h"

namespace colony {

// Sets up the default logger. `level` empty means: use COLONY_LOG, else "info".
// Returns InvalidArgument for an unknown level name (the logger is left at "info").
Status InitLogging(std::string_view level = {});

}  // namespace colony

#define COLONY_LOG_TRACE(...) SPDLOG_TRACE(__VA_ARGS__)
#define COLONY_LOG_DEBUG(...) ::spdlog::debug(__VA_ARGS__)
#define COLONY_LOG_INFO(...) ::spdlog::info(__VA_ARGS__)
#define COLONY_LOG_WARN(...) ::spdlog::warn(__VA_ARGS__)
#define COLONY_LOG_ERROR(...) ::spdlog::error(__VA_ARGS__)
