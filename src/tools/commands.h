// Subcommands of the `colony` CLI. Each Add* function registers one subcommand on the app and
// returns the function that runs it (returning the process exit code).
#pragma once

#include <CLI/CLI.hpp>
#include <functional>
#include <nlohmann/json.hpp>
#include <string>

#include "core/multiaddr.h"
#include "core/status.h"

namespace colony::http {
struct ServerOptions;
}  // namespace colony::http

namespace colony::cli {

using Command = std::function<int()>;

void AddAuthorityCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);
void AddIdentityCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);
void AddPeerCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);
void AddDhtCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);
void AddAverageCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);
void AddServersCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);
void AddMonitorCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);
void AddApiCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);
void AddServeCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);
void AddTrainCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);
void AddExpertsCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);
void AddSwarmTrainCommands(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);
// colony swarm-train trainer: the train command's flags with --task swarm-lm (train_cmd.cpp).
void AddSwarmTrainerCommand(CLI::App* swarm_train,
                            std::vector<std::pair<CLI::App*, Command>>& commands);
void AddDemoCommand(CLI::App& app, std::vector<std::pair<CLI::App*, Command>>& commands);

// One-line JSON as the CLI prints it (invalid UTF-8 in values is replaced, never thrown on).
inline std::string Dump(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

// Every option that takes a peer's or a listen address checks it with this when the command line
// is parsed: a value that is not a multiaddr (core/multiaddr.h) is an error that names the option.
// Peers to join through are always --initial-peers.
CLI::Validator MultiaddrCheck();

// The --announce option of every command that listens: where others should dial this peer,
// given instead of its listen addresses (repeatable; dht::NodeOptions::announce).
void AddAnnounceOption(CLI::App* cmd, std::vector<std::string>& announce);
// Those addresses as multiaddrs; an error names the option and the address.
Result<std::vector<Multiaddr>> ParseAnnounce(const std::vector<std::string>& announce);

// The --http option of colony api, monitor and authority serve: "host:port" (an IPv6 host in
// brackets; port 0: any free port). Errors name the option.
Result<std::pair<std::string, uint16_t>> ParseHostPort(const std::string& text);

// Their --tls-cert, --tls-key (HTTPS) and --max-connections-per-address options.
struct HttpServeArgs {
  std::string certificate, key;
  int max_connections_per_address = 32;
  bool tls() const { return !certificate.empty(); }
  // The options to name in an error of the server's start.
  std::string OptionNames() const { return tls() ? "--http/--tls-cert/--tls-key" : "--http"; }
  // Sets these options' fields of an http::ServerOptions.
  void ApplyTo(http::ServerOptions& options) const;
};
void AddHttpServeOptions(CLI::App* cmd, HttpServeArgs& args);
// Whether a --http host is loopback (the commands warn when they expose keys beyond it).
bool IsLoopbackHost(const std::string& host);

// Prints "colony: error: <message>" on stderr (one line) and returns exit code 1.
int Fail(const Status& status);
int Fail(const std::string& message);

// Blocks SIGINT and SIGTERM in the calling thread (call before starting threads) and waits for
// one of them; returns the signal's name.
void BlockTerminationSignals();
std::string WaitForTerminationSignal();

}  // namespace colony::cli
