// Protobuf's own log lines go to Colony's log at debug level instead of stderr. libprotobuf
// prints an ERROR line for every proto3 string field with invalid UTF-8 it parses, and remote
// peers choose those bytes: left on stderr, any peer could write a line to a node's terminal
// with every frame it sends (the message is refused either way).
//
//   RouteProtobufLogs();   // once per process; Host's constructor calls it
#pragma once

namespace colony::net {

void RouteProtobufLogs();

}  // namespace colony::net
