// spillway: the CLI entry point. Verbs live in cmd_*.cpp.
#include <string>

#include "app/commands.h"
#include "backend/cpu/kernel_variant.h"

int main(int argc, char** argv) {
  CLI::App app{"Spillway: local AI serving gateway with a planned CPU overflow path"};
  app.require_subcommand(1);
  // --cpu-variant is every verb's (fallthrough: `spillway serve --cpu-variant
  // x86-64-v3` works), applied before the verb runs.
  app.fallthrough();
  std::string cpu_variant;
  app.add_option("--cpu-variant", cpu_variant,
                 "CPU kernel variant: auto (the best this CPU runs), or one of those `spillway devices` lists")
      ->envname(spw::cpu::kKernelVariantEnv);
  app.parse_complete_callback([&] {
    if (cpu_variant.empty()) return;
    if (spw::Status s = spw::cpu::use_kernel_variant(cpu_variant); !s.ok()) {
      throw CLI::ValidationError("--cpu-variant", s.message());
    }
  });
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
