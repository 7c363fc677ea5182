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
void add_hash_key(CLI::App& app, int& exit_code);
void add_chat(CLI::App& app, int& exit_code);

// Adds `--config FILE` and `--dump-config` to the verb `sub`; call it before
// adding the verb's own options (those may sit in option groups). The file
// is TOML whose top-level keys are the verb's flag names without the leading
// dashes: strings, integers, floats as the option's type takes; `true` gives
// a flag, `false` leaves it off; an array gives a repeatable option once per
// element. An option also given on the command line keeps the command line's
// value (the key is skipped). A missing or unparsable file, an unknown key, a
// section, a value of the wrong type or one the option refuses fail the parse
// with exit code 2 and a message naming the file, the line and the key.
// `--dump-config` prints every setting (as given, else its default) in that
// format and exits 0.
void add_config_file_options(CLI::App& sub);

}  // namespace spw::app
