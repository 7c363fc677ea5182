#!/usr/bin/env bash
# Builds the libFuzzer targets with the `asan` preset (clang, ASan+UBSan: the
# build CI's sanitizer tests use, so after them this builds nothing) and
# runs each for a bounded time, one per core at a time (SPILLWAY_FUZZ_JOBS).
#   fuzz/run_fuzzers.sh [SECONDS_PER_TARGET=60] [extra libFuzzer flags...]
# Targets: gguf_fuzz (GGUF reader/writer), tokenizer_fuzz (SPM and BPE encode/decode, BPE pre-tokenizers,
# Utf8Stream), checkpoint_fuzz (checkpoint parser), http_fuzz (HTTP request ->
# OpenAI request: the transport's parser and checks, then the body parsers). Exits non-zero when a
# fuzzer finds a crash, leak, timeout or property violation; reproducers go to
# build/fuzz/artifacts/. New corpus entries go to build/fuzz/corpus/<target>
# (the committed seeds in fuzz/corpus/<target> are only read).
set -euo pipefail

secs="${1:-60}"
shift || true
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

targets=(gguf tokenizer checkpoint http)
cmake --preset asan >/dev/null
cmake --build --preset asan --target "${targets[@]/%/_fuzz}"

artifacts="$root/build/fuzz/artifacts"
logs="$root/build/fuzz/logs"
mkdir -p "$artifacts" "$logs"
# Each fuzzer is one process on one core: they run SPILLWAY_FUZZ_JOBS at a
# time (default: one per core), each for the full SECONDS, so the fuzzing is
# the same as one after another in a fraction of the wall time. A fuzzer's
# output goes to build/fuzz/logs/<target>.log; its last lines (the final
# stats, or the crash report) are printed when it ends.
fuzz_one() {
  local t="$1" corpus="$root/build/fuzz/corpus/$1"
  mkdir -p "$corpus"
  local extra=() seeds=()
  [ -f "$root/fuzz/$t.dict" ] && extra+=(-dict="$root/fuzz/$t.dict")
  [ -d "$root/fuzz/corpus/$t" ] && seeds+=("$root/fuzz/corpus/$t")
  "$root/build/asan/fuzz/${t}_fuzz" \
    -max_total_time="$secs" \
    -max_len=65536 \
    -timeout=10 \
    -rss_limit_mb=2048 \
    -print_final_stats=1 \
    -artifact_prefix="$artifacts/${t}-" \
    "${extra[@]}" "${fuzz_flags[@]}" \
    "$corpus" "${seeds[@]}" >"$logs/$t.log" 2>&1
}

fuzz_flags=("$@")
jobs_max="${SPILLWAY_FUZZ_JOBS:-$(nproc)}"
failed=0
for ((i = 0; i < ${#targets[@]}; i += jobs_max)); do
  batch=("${targets[@]:i:jobs_max}")
  pids=()
  for t in "${batch[@]}"; do
    echo "== fuzzing $t for ${secs}s"
    fuzz_one "$t" &
    pids+=($!)
  done
  for j in "${!batch[@]}"; do
    t="${batch[$j]}"
    if wait "${pids[$j]}"; then
      echo "== $t: done"
      tail -n 12 "$logs/$t.log"
    else
      echo "== $t: FAILED (reproducer in $artifacts; log $logs/$t.log)"
      tail -n 80 "$logs/$t.log"
      failed=1
    fi
  done
done
exit "$failed"
