# spw_sampling: portable RNG, token sampler, stop-string matcher.
add_library(spw_sampling STATIC
  ${CMAKE_CURRENT_LIST_DIR}/sampler.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stop_rules.cpp)
target_link_libraries(spw_sampling PUBLIC spw_core)

spw_add_test(sampler_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/sampler_test.cpp LIBS spw_sampling LABELS unit)
spw_add_test(stop_rules_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/stop_rules_test.cpp LIBS spw_sampling LABELS unit)
