#include "net/protobuf_logs.h"

#include <google/protobuf/stubs/logging.h>

#include <mutex>
#include <string>

#include "core/log.h"

namespace colony::net {

namespace {
void ToColonyLog(google::protobuf::LogLevel level, const char* file, int line,
                 const std::string& message) {
  if (level == google::protobuf::LOGLEVEL_FATAL) {
    // A bug in Colony's use of protobuf, not remote input: protobuf aborts after this.
    COLONY_LOG_ERROR("protobuf ({}:{}): {}", file, line, message);
    return;
  }
  COLONY_LOG_DEBUG("protobuf ({}:{}): {}", file, line, message);
}
}  // namespace

void RouteProtobufLogs() {
  static std::once_flag once;
  std::call_once(once, [] { google::protobuf::SetLogHandler(&ToColonyLog); });
}

}  // namespace colony::net
