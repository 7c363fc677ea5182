// What the simulation's tests share (drill/simulation_test.cpp and
// app/drill_scenario_test.cpp, which needs the serve flag parser): the seed
// count from SPW_SIM_SEEDS (CI under sanitizers sets fewer) and a summary's
// text for a failure message.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <string>

#include "drill/simulation.h"

namespace spw::drill {

inline int64_t seeds_from_env(int64_t dflt) {
  const char* v = std::getenv("SPW_SIM_SEEDS");
  if (v == nullptr || *v == '\0') return dflt;
  const long long n = std::atoll(v);
  return n > 0 ? n : dflt;
}

// Counts, then the first five failing seeds with their replay commands.
inline std::string describe(const SimSummary& s) {
  std::string out = std::string(sim_mode_name(s.mode)) + ": " + std::to_string(s.passed) + "/" +
                    std::to_string(s.seeds) + " passed, accepted " + std::to_string(s.accepted) + ", succeeded " +
                    std::to_string(s.succeeded) + ", over reserve " + std::to_string(s.over_reserve);
  for (size_t i = 0; i < s.failures.size() && i < 5; ++i) {
    out += "\n  seed " + std::to_string(s.failures[i].seed) + ": " + s.failures[i].detail + "\n    " +
           s.failures[i].command;
  }
  return out;
}

}  // namespace spw::drill
