#!/usr/bin/env python3
"""Long-context cost on the CPU path: prefill and decode speed, and peak RSS,
at prompt depths of about 512, 2048 and 8192 tokens, per thread count.

What it answers: does the cost per token grow smoothly with the depth (the
attention term, linear in the positions per token), or does something fall
off a cliff (a score matrix of n_ctx x n_ctx, a cache-hostile layout)?
Each (depth, threads) runs `spillway generate --json` in a fresh process,
interleaved, so peak RSS is per configuration and machine noise spreads
over all rows.

Usage: bench/run_long_context.py [--build build/release] [--preset 15m]
       [--type f32] [--depths 512,2048,8192] [--threads 1,2] [--decode 16]
       [--kv-types f16] [--baseline OTHER_BUILD]
--kv-types runs each row once per KV cache type (`generate --kv-type`);
--baseline adds a second build's spillway (e.g. before a change; it runs
with its own default KV type and no --kv-type flag) to the interleaving.
The model is generated on first use into BUILD/bench-models with a context
long enough for the deepest prompt (random weights, real 32000-token Llama
vocabulary). Prints a Markdown table for docs/PERFORMANCE.md.
"""
import argparse
import datetime
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_engine_bench import cpu_name  # noqa: E402  (one definition of the machine's name)


def ensure_model(build, preset, typ, ctx):
    path = os.path.join(build, "bench-models", f"long-{preset}-{typ}-{ctx}.gguf")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run([os.path.join(build, "spillway-gen-model"), "--preset", preset, "--type", typ, "--ctx",
                        str(ctx), "--seed", "1", "--vocab", os.path.join(ROOT, "tests/data/ggml-vocab-llama-spm.gguf"),
                        "--out", path], check=True, stdout=subprocess.DEVNULL)
    return path


def prompt_file(build, depth):
    """A text of roughly `depth` tokens: bench/prompt.txt repeated (the
    Llama vocabulary gives about 1.3 tokens per word of it); the exact count
    is what the run reports."""
    with open(os.path.join(ROOT, "bench", "prompt.txt")) as f:
        words = f.read().split()
    want = int(depth / 1.3)
    text = " ".join((words * (want // len(words) + 1))[:want])
    path = os.path.join(build, "bench-models", f"long-prompt-{depth}.txt")
    with open(path, "w") as f:
        f.write(text)
    return path


def run(build, model, prompt, threads, ctx, n_decode, kv_type=None):
    cmd = [os.path.join(build, "spillway"), "generate", "--model", model, "--file", prompt, "-n", str(n_decode),
           "--temp", "0", "--threads", str(threads), "--ctx", str(ctx), "--json"]
    if kv_type:
        cmd += ["--kv-type", kv_type]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--preset", default="15m")
    ap.add_argument("--type", default="f32")
    ap.add_argument("--depths", default="512,2048,8192")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--decode", type=int, default=16)
    ap.add_argument("--kv-types", default="f16")
    ap.add_argument("--baseline", default=None)
    args = ap.parse_args()
    depths = [int(d) for d in args.depths.split(",")]
    threads = [int(t) for t in args.threads.split(",")]
    ctx = max(depths) + max(256, args.decode * 2)
    model = ensure_model(args.build, args.preset, args.type, ctx)
    prompts = {d: prompt_file(args.build, d) for d in depths}
    # (label, build, kv type flag) per program; every row runs each of them
    # back to back so drift on a shared machine hits all alike.
    programs = [(f"kv {kv}", args.build, kv) for kv in args.kv_types.split(",")]
    if args.baseline:
        programs.append(("baseline", args.baseline, None))
    rows = []
    for d in depths:
        for t in threads:
            for label, build, kv in programs:
                r = run(build, model, prompts[d], t, ctx, args.decode, kv)
                tm = r["timings"]
                rows.append((label, len(r["prompt_tokens"]), t, tm["prefill_tokens_per_s"],
                             tm["decode_tokens_per_s"], tm["peak_rss_bytes"] / 2**20))
                print(f"{label} depth {rows[-1][1]} threads {t}: prefill {rows[-1][3]:.1f} tok/s, "
                      f"decode {rows[-1][4]:.1f} tok/s, peak RSS {rows[-1][5]:.0f} MiB", file=sys.stderr)
    print(f"Long context, {args.preset} {args.type.upper()} weights, {datetime.date.today()}, {cpu_name()}, "
          f"{os.cpu_count()} cores; decode = {args.decode} tokens after the prompt.\n")
    print("| program | prompt tokens | threads | prefill tok/s | decode tok/s at that depth | peak RSS MiB |")
    print("|---|---:|---:|---:|---:|---:|")
    for label, n, t, p, dec, rss in rows:
        print(f"| {label} | {n} | {t} | {p:.1f} | {dec:.1f} | {rss:.0f} |")
    first = rows[0][1]
    base = {(label, t): (p, dec) for label, n, t, p, dec, _ in rows if n == first}
    print("\nRelative to the shallowest prompt (same program and threads): "
          + "; ".join(f"{label} {n} tok x{t}: prefill {p / base[(label, t)][0]:.2f}x, "
                      f"decode {dec / base[(label, t)][1]:.2f}x"
                      for label, n, t, p, dec, _ in rows if n != first))

if __name__ == "__main__":
    main()
