// CLI verbs of the `spillway` binary. Each add_* registers one subcommand on
// `app`; when that subcommand is parsed its callback runs the verb and stores the
// process exit code in `exit_code`: 0 on success, 1 when the operation failed
// (with a message on stderr naming the problem). Bad usage exits 2 via CLI11.
#pragma once

#include <CLI/CLI.hpp>

namespace spw::app {

void add_inspect(CLI::App& app, int& exit_code);
void add_tokenize(CLI::App& app, int& exit_code);
void add_generate(CLI::App& app, int& exit_code);
void add_serve(CLI::App& app, int& exit_code);
void add_devices(CLI::App& app, int& exit_code);
void add_estimate(CLI::App& app, int& exit_code);
void add_reserve(CLI::App& app, int& exit_code);
void add_occupy(CLI::App& app, int& exit_code);
void add_drill(CLI::App& app, int& exit_code);

}  // namespace spw::app
