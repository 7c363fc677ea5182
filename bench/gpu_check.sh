#!/bin/bash
# GPU check: every test binary that opens a Vulkan device, then the engine,
# batching, recovery and estimator benchmarks on the Vulkan device, in one
# bounded run (minutes), for a machine with a real GPU. Results go to OUTDIR:
#   summary.txt   GPU, driver, one line per test binary (rc, seconds), phases
#   devices.txt   `spillway devices` (NVML, Vulkan heaps and budgets)
#   tests.log     failures and skips of each test binary
#   engine.jsonl  `spillway generate --json` per model x placement (cpu, vulkan, hybrid:4)
#   batching.txt, recovery.txt, estimator.md
# Usage: bench/gpu_check.sh [BUILD=build/release] [OUTDIR=gpu-check]
# Test binaries find the repository through the path they were built in
# (SPILLWAY_SOURCE_DIR): run from that checkout, or make that path lead here.
set -u
B=${1:-build/release}
O=${2:-gpu-check}
mkdir -p "$O"
S=$O/summary.txt
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total,memory.used --format=csv 2>/dev/null;
  grep -m1 "model name" /proc/cpuinfo; nproc; } > "$S" 2>&1
timeout 60 "$B/spillway" devices > "$O/devices.txt" 2>&1
timeout 30 "$B/spillway" devices --json >> "$O/devices.txt" 2>&1
grep -q "^vulkan:0" "$O/devices.txt" || echo "warning: no Vulkan device; the tests will skip" >> "$S"

T=$O/tests.log; : > "$T"
run_test() {
  local t=$1 log=/tmp/gpu_check.$(basename "$1") s=$(date +%s)
  timeout 150 "$t" --gtest_brief=1 > "$log" 2>&1
  echo "== $t rc=$? $(( $(date +%s) - s )) s" > "$log.head"
}
export -f run_test
tests=(src/backend/vulkan/vulkan_support_test src/backend/vulkan/fault_injector_test
       src/backend/vulkan/vulkan_backend_test src/engine/device_session_test src/engine/generate_test
       src/admission/estimator_test src/admission/estimator_vulkan_test src/admission/controller_test
       src/journal/journal_test src/serve/scheduler_test src/gateway/gateway_test src/gateway/builder_test
       src/gateway/recovery_test src/drill/drill_core_test src/app/cli_test tools/echo_llama_test
       tests/engine_reference_test tests/integration/serve_cli_test tests/integration/fault_admin_test
       tests/integration/resume_test tests/integration/drill_test src/core/core_test)
printf "$B/%s\n" "${tests[@]}" | xargs -P "$(nproc)" -I{} bash -c 'run_test {}'
for t in "${tests[@]}"; do
  n=/tmp/gpu_check.$(basename "$t")
  cat "$n.head" >> "$T"
  grep -E "FAILED|Failure|Expected|Which is|actual|SKIPPED|PASSED" "$n" | head -60 >> "$T"
done
grep "^==" "$T" >> "$S"

E=$O/engine.jsonl; : > "$E"
mkdir -p "$B/bench-models"
for spec in "15m f32" "110m f16" "110m q8_0" "1b q8_0"; do
  set -- $spec
  m=$B/bench-models/gen-$1-$2.gguf
  [ -f "$m" ] || timeout 120 "$B/spillway-gen-model" --preset "$1" --type "$2" --seed 1 --out "$m" > /dev/null
  for d in cpu vulkan hybrid:4; do
    r=$(timeout 60 "$B/spillway" generate -m "$m" --json --file bench/prompt.txt -n 128 --temp 0 --ignore-eos \
          --ctx 1024 --threads 8 --device "$d" 2>> "$S" | tr -d '\n')
    echo "{\"model\":\"gen-$1-$2\",\"device\":\"$d\",\"result\":${r:-null}}" >> "$E"
  done
done
echo "== engine done" >> "$S"
timeout 150 "$B/bench/batching_bench" --device vulkan --reps 1 --tokens 48 --models-dir "$B/bench-models" \
  > "$O/batching.txt" 2>&1; echo "== batching rc=$?" >> "$S"
timeout 120 "$B/bench/recovery_bench" --scenario all --reps 1 --models-dir "$B/bench-models" \
  > "$O/recovery.txt" 2>&1; echo "== recovery rc=$?" >> "$S"
timeout 100 "$B/bench/estimator_accuracy" --matrix quick --only vulkan --models-dir "$B/bench-models" \
  --markdown "$O/estimator.md" >> "$S" 2>&1; echo "== estimator rc=$?" >> "$S"
