// spillway: the CLI entry point. Verbs live in cmd_*.cpp.
#include "app/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"Spillway: local AI serving gateway with a planned CPU overflow path"};
  app.require_subcommand(1);
  int exit_code = 0;
  spw::app::add_inspect(app, exit_code);
  spw::app::add_tokenize(app, exit_code);
  spw::app::add_generate(app, exit_code);
  spw::app::add_serve(app, exit_code);
  spw::app::add_devices(app, exit_code);
  spw::app::add_estimate(app, exit_code);
  spw::app::add_reserve(app, exit_code);
  spw::app::add_occupy(app, exit_code);
  spw::app::add_drill(app, exit_code);
  spw::app::add_hash_key(app, exit_code);
  spw::app::add_chat(app, exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}
