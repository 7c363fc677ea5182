#!/usr/bin/env bash
# Builds the GGUF fuzzer with the `fuzz` preset (clang, libFuzzer, ASan+UBSan)
# and runs it for a bounded time.
#   fuzz/run_gguf_fuzz.sh [SECONDS=60] [extra libFuzzer flags...]
# Exits non-zero when the fuzzer finds a crash, leak, timeout or property
# violation; the reproducer is written to build/fuzz/artifacts/. New corpus
# entries go to build/fuzz/corpus/gguf (the committed seeds in
# fuzz/corpus/gguf are only read).
set -euo pipefail

secs="${1:-60}"
shift || true
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$root"

cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target gguf_fuzz

bin="$root/build/fuzz/fuzz/gguf_fuzz"
corpus="$root/build/fuzz/corpus/gguf"
artifacts="$root/build/fuzz/artifacts"
mkdir -p "$corpus" "$artifacts"

echo "fuzzing GGUF reader for ${secs}s (corpus $corpus)"
"$bin" \
  -max_total_time="$secs" \
  -max_len=65536 \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -print_final_stats=1 \
  -dict="$root/fuzz/gguf.dict" \
  -artifact_prefix="$artifacts/" \
  "$@" \
  "$corpus" "$root/fuzz/corpus/gguf"
