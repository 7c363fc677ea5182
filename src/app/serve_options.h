// The `spillway serve` flags: registering them on a CLI11 app, and turning
// their text into typed gateway::GatewayOptions. Used by `spillway serve`
// (cmd_serve.cpp) and by `spillway drill --simulate` (cmd_drill.cpp), which
// parses a scenario's server.args with the same flags, defaults and checks
// as the server it stands for.
//
// Contract: add_serve_options(sub, o) adds every serve flag to `sub` (in
// --dump-config's order; add_config_file_options goes first) storing into
// `o`; `o` must outlive `sub`'s parse. The flags that GatewayOptions holds
// typed (device, kv-type, replica, overflow, host-budget, device-memory,
// device-headroom, co-tenant) and the journal sizes are kept as their text in
// ServeCliOptions::text (so --dump-config and the config file show what was
// given, byte for byte) until gateway_options() parses them: InvalidArgument
// whose message names the flag (`--device: ...`) for a value that does not
// parse. Range checks stay where they are: CLI11's
// validators at parse time, build_gateway's checks at build time; with_flags()
// adds the dashes to a library error that starts with a flag's key, so the
// user reads `--ctx must be ...` as before.
// parse_serve_args(args) parses `args` (without the program and verb: e.g.
// {"--model", "m.gguf", "--ctx", "256"}) exactly as `spillway serve ARGS`
// would, then gateway_options(); a usage error (unknown flag, a value a
// validator refuses) is InvalidArgument with CLI11's message.
// Thread safety: none (CLI11 apps are single-threaded).
#pragma once

#include <CLI/CLI.hpp>
#include <string>
#include <vector>

#include "core/status.h"
#include "gateway/builder.h"

namespace spw::app {

// The flags GatewayOptions holds typed, as given (defaults: GatewayOptions',
// spelled as the flags take them).
struct GatewayFlagText {
  std::string device = "cpu";  // cpu | vulkan[:i] | hybrid:N[:i]
  std::string kv_type = "f16";
  std::string replica = "auto";
  std::string overflow = "planned";
  std::string host_budget;    // SIZE; "": none
  std::string device_memory;  // SIZE; "": the largest device-local heap
  std::string device_headroom = "0";
  std::vector<std::string> co_tenants;  // NAME=SIZE
  // Sizes as text (parse_byte_size), like --max-body; defaults: GatewayOptions'.
  std::string journal_max_bytes = "1GiB";
  std::string journal_max_body_bytes = "64KiB";
};

struct ServeCliOptions {
  gateway::GatewayOptions g;  // the typed fields are set by gateway_options()
  GatewayFlagText text;
  // --model (repeatable; [NAME=]PATH): the first is the served model, the
  // others join the catalogue (gateway::CatalogueModel); --pin, --preload and
  // --model-keep-alive NAME=DURATION name catalogue models; --keep-alive is
  // their default (a duration: "5m", "300", "-1" for forever).
  std::vector<std::string> models;
  std::vector<std::string> pin;
  std::vector<std::string> preload;
  std::vector<std::string> model_keep_alive;
  std::string keep_alive = "5m";
  std::string host = "127.0.0.1";
  int port = 8080;
  double grace_s = 10;
  bool log_requests = false;
  std::string admin_token;  // "" = no admin API
  std::vector<std::string> aliases;
  std::vector<std::string> api_keys;
  std::vector<std::string> api_key_hashes;
  bool insecure_no_auth = false;
  std::string max_body = "16MiB";
  int max_connections = 512;
  int max_connections_per_client = 64;
  std::vector<std::string> allowed_hosts;
  double idle_timeout_s = 60;
  double header_timeout_s = 10;
  double body_timeout_s = 60;
};

void add_serve_options(CLI::App& sub, ServeCliOptions& o);

// o.g with the typed fields parsed from o.text.
Result<gateway::GatewayOptions> gateway_options(const ServeCliOptions& o);

// `st` with "--" before a leading option key (see the contract).
Status with_flags(const Status& st);

Result<gateway::GatewayOptions> parse_serve_args(const std::vector<std::string>& args);

}  // namespace spw::app
