#!/usr/bin/env python3
"""CPU prefill and decode, Spillway side by side with llama.cpp's llama-bench.

Generates models with spillway-gen-model (random weights, real 32000-token
Llama vocabulary; GGUF files llama.cpp loads) and measures, per weight type
and thread count, interleaved in one run:

  prefill  a prompt of --prompt tokens (default 818) in --ubatch batches:
           `spillway generate -n 1` (prefill_tokens_per_s) against
           `llama-bench -p N -n 0` (pp N);
  decode   --gen tokens (default 128) after a 2-token prompt:
           `spillway generate` (decode_tokens_per_s) against
           `llama-bench -p 0 -n G` (tg G, which starts from an empty context).

Each round runs every configuration once per program, alternating which
program goes first (A B / B A) so drift on a shared machine hits both; the
table reports the median over rounds and the ratio Spillway / llama.cpp.
Optional --baseline BUILD adds a second Spillway build (e.g. before a change)
to the same interleaving, with its own ratio column. --variant and
--baseline-variant choose the CPU kernel variant each Spillway runs
(SPILLWAY_CPU_VARIANT: x86-64-v3, ...; default the best this CPU runs), so
one build's variants compare too (--baseline build/release
--baseline-variant x86-64-v2); the header names them.

llama.cpp is never built or fetched here: pass the path of an existing
llama-bench binary with --llama-bench; without it only Spillway runs.

Usage: bench/cpu_side_by_side.py [--build build/release] [--baseline DIR]
          [--variant NAME] [--baseline-variant NAME] [--llama-bench PATH] [--types f32,f16,q8_0] [--threads 1,2]
          [--prompt 818] [--gen 128] [--rounds 2] [--preset 110m]
"""
import argparse
import datetime
import json
import os
import statistics
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from run_engine_bench import cpu_name  # noqa: E402  (one definition of the machine's name)


def ensure_model(build, preset, typ):
    path = os.path.join(build, "bench-models", f"gen-{preset}-{typ}.gguf")
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        kind = ["--mix", typ] if typ in ("q4_k_m", "q5_k_m") else ["--type", typ]  # llama.cpp's mixed recipes
        subprocess.run([os.path.join(build, "spillway-gen-model"), "--preset", preset] + kind + ["--seed", "1",
                        "--out", path], check=True, stdout=subprocess.DEVNULL)
    return path


def n_tokens(spillway, model, text):
    out = subprocess.run([spillway, "tokenize", "--model", model, "--", text], check=True,
                         capture_output=True, text=True).stdout
    return len(json.loads(out))


def prompt_of(spillway, model, target):
    """Text from bench/prompt.txt (repeated) that tokenizes to exactly `target`
    tokens with BOS, padded with single-token words."""
    with open(os.path.join(ROOT, "bench", "prompt.txt")) as f:
        words = f.read().split()
    def text(k):
        return " ".join(words[i % len(words)] for i in range(k))
    lo, hi = 1, target
    while lo < hi:  # the largest word count whose tokenization fits
        mid = (lo + hi + 1) // 2
        if n_tokens(spillway, model, text(mid)) <= target:
            lo = mid
        else:
            hi = mid - 1
    t = text(lo)
    while n_tokens(spillway, model, t) < target:
        t += " the"
    got = n_tokens(spillway, model, t)
    if got != target:
        sys.exit(f"could not build a {target}-token prompt (got {got})")
    return t


def variant_env(variant):
    env = dict(os.environ)
    env.pop("SPILLWAY_CPU_VARIANT", None)
    if variant:
        env["SPILLWAY_CPU_VARIANT"] = variant
    return env


def active_variant(spillway, variant):
    """The kernel variant `spillway devices` reports for this choice ("" for a
    build without variants)."""
    out = subprocess.run([spillway, "devices", "--json"], capture_output=True, text=True, env=variant_env(variant))
    try:
        return json.loads(out.stdout).get("cpu", {}).get("kernels", "")
    except json.JSONDecodeError:
        return ""


def spillway_run(spillway, model, prompt, n_gen, threads, ctx, ubatch, variant):
    cmd = [spillway, "generate", "--json", "--model", model, "--prompt", prompt, "-n", str(n_gen), "--temp", "0",
           "--ignore-eos", "--threads", str(threads), "--ctx", str(ctx), "--ubatch", str(ubatch)]
    j = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True, env=variant_env(variant)).stdout)
    return j["timings"]


def llama_run(llama_bench, model, n_prompt, n_gen, threads, ubatch):
    cmd = [llama_bench, "-m", model, "-p", str(n_prompt), "-n", str(n_gen), "-t", str(threads), "-ub", str(ubatch),
           "-r", "1", "-o", "json"]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)[0]["avg_ts"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--baseline", help="a second Spillway build directory (its spillway binary) to compare")
    ap.add_argument("--variant", default="", help="CPU kernel variant of --build's runs (default: the best)")
    ap.add_argument("--baseline-variant", default="", help="CPU kernel variant of --baseline's runs")
    ap.add_argument("--llama-bench", help="path of an existing llama.cpp llama-bench binary")
    ap.add_argument("--types", default="f32,f16,q8_0")
    ap.add_argument("--threads", default="1,2")
    ap.add_argument("--prompt", type=int, default=818)
    ap.add_argument("--gen", type=int, default=128)
    ap.add_argument("--ubatch", type=int, default=512)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--preset", default="110m")
    ap.add_argument("--skip", default="", help="comma list of prefill,decode to skip")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    progs = [("spillway", os.path.join(build, "spillway"))]
    variants = {"spillway": args.variant}
    if args.baseline:
        progs.append(("baseline", os.path.join(os.path.abspath(args.baseline), "spillway")))
        variants["baseline"] = args.baseline_variant
    if args.llama_bench:
        progs.append(("llama.cpp", os.path.abspath(args.llama_bench)))
    types = args.types.split(",")
    threads = [int(t) for t in args.threads.split(",")]
    phases = [p for p in ("prefill", "decode") if p not in args.skip.split(",")]
    ctx = args.prompt + args.gen + 16

    models = {t: ensure_model(build, args.preset, t) for t in types}
    long_prompt = prompt_of(progs[0][1], models[types[0]], args.prompt)
    short_prompt = "Once"

    res = {}  # (type, threads, phase, prog) -> [tok/s]
    for rnd in range(args.rounds):
        for typ in types:
            for th in threads:
                for phase in phases:
                    order = progs if (rnd % 2 == 0) else list(reversed(progs))
                    for name, exe in order:
                        if name == "llama.cpp":
                            v = (llama_run(exe, models[typ], args.prompt, 0, th, args.ubatch) if phase == "prefill"
                                 else llama_run(exe, models[typ], 0, args.gen, th, args.ubatch))
                        elif phase == "prefill":
                            v = spillway_run(exe, models[typ], long_prompt, 1, th, ctx, args.ubatch,
                                             variants[name])["prefill_tokens_per_s"]
                        else:
                            v = spillway_run(exe, models[typ], short_prompt, args.gen, th, ctx, args.ubatch,
                                             variants[name])["decode_tokens_per_s"]
                        res.setdefault((typ, th, phase, name), []).append(v)
                        print(f"round {rnd + 1} {typ} t={th} {phase} {name}: {v:.1f} tok/s", file=sys.stderr)

    try:
        load = os.getloadavg()[0]
    except OSError:
        load = float("nan")
    print(f"Machine: {cpu_name()}, {os.cpu_count()} cores; "
          f"{datetime.datetime.now(datetime.timezone.utc).strftime('%Y-%m-%d %H:%M UTC')}; load average {load:.1f} "
          f"at the end; gen-model {args.preset}; prefill {args.prompt} tokens (ubatch {args.ubatch}), decode "
          f"{args.gen} tokens; median of {args.rounds} interleaved rounds (tok/s).")
    for name, exe in progs:
        if name in variants:
            print(f"{name}: CPU kernels {active_variant(exe, variants[name]) or 'of its build (no variants)'}")
    print()
    names = [n for n, _ in progs]
    head = "| type | threads | phase | " + " | ".join(names)
    ratio_cols = []
    if "llama.cpp" in names:
        ratio_cols = [n for n in names if n != "llama.cpp"]
        head += " | " + " | ".join(f"{n} / llama.cpp" for n in ratio_cols)
    if "baseline" in names:
        head += " | spillway / baseline"
    print(head + " |")
    print("|" + "---|" * (head.count("|")))
    for typ in types:
        for th in threads:
            for phase in phases:
                med = {n: statistics.median(res[(typ, th, phase, n)]) for n in names}
                row = f"| {typ} | {th} | {phase} | " + " | ".join(f"{med[n]:.1f}" for n in names)
                if ratio_cols:
                    row += " | " + " | ".join(f"{med[n] / med['llama.cpp']:.2f}" for n in ratio_cols)
                if "baseline" in names:
                    row += f" | {med['spillway'] / med['baseline']:.2f}"
                print(row + " |")


if __name__ == "__main__":
    main()
