#!/usr/bin/env bash
# Builds the libFuzzer targets with the `fuzz` preset (clang, ASan+UBSan) and
# runs each for a bounded time.
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
cmake --preset fuzz >/dev/null
cmake --build --preset fuzz --target "${targets[@]/%/_fuzz}"

artifacts="$root/build/fuzz/artifacts"
mkdir -p "$artifacts"
for t in "${targets[@]}"; do
  corpus="$root/build/fuzz/corpus/$t"
  mkdir -p "$corpus"
  extra=()
  [ -f "$root/fuzz/$t.dict" ] && extra+=(-dict="$root/fuzz/$t.dict")
  seeds=()
  [ -d "$root/fuzz/corpus/$t" ] && seeds+=("$root/fuzz/corpus/$t")
  echo "== fuzzing $t for ${secs}s"
  "$root/build/fuzz/fuzz/${t}_fuzz" \
    -max_total_time="$secs" \
    -max_len=65536 \
    -timeout=10 \
    -rss_limit_mb=2048 \
    -print_final_stats=1 \
    -artifact_prefix="$artifacts/${t}-" \
    "${extra[@]}" "$@" \
    "$corpus" "${seeds[@]}"
done
