#!/usr/bin/env python3
"""Engine benchmark: prefill and decode tokens/s and peak RSS per model and
thread count, side by side with this machine's measured read bandwidth.

Runs `spillway generate --json` once per (model, threads) in a fresh process
(so peak RSS is per configuration) and `memory_bandwidth_bench` in the same
session, then prints a Markdown table for docs/PERFORMANCE.md.

Usage: bench/run_engine_bench.py [--build build/release] [--tokens 128] [--quick]
Models: stories260K, gen 15M F32 and (unless --quick) gen 110M in F16, Q8_0,
Q4_K and Q6_K.
Models are generated on first use into BUILD/bench-models with
spillway-gen-model (random weights, real 32000-token Llama vocabulary).
"""
import argparse
import json
import os
import platform
import subprocess
import sys
import datetime

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run_json(cmd):
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out)


def ensure_model(build, name, preset, typ):
    path = os.path.join(build, "bench-models", name)
    if not os.path.exists(path):
        os.makedirs(os.path.dirname(path), exist_ok=True)
        subprocess.run([os.path.join(build, "spillway-gen-model"), "--preset", preset, "--type", typ,
                        "--seed", "1", "--out", path], check=True, stdout=subprocess.DEVNULL)
    return path


def bandwidth(build):
    exe = os.path.join(build, "bench", "memory_bandwidth_bench")
    out = subprocess.run([exe, "--benchmark_format=json", "--benchmark_min_time=0.5"], check=True,
                         capture_output=True, text=True).stdout
    res = {}
    for b in json.loads(out)["benchmarks"]:
        threads = int(b["name"].split("/")[1])
        res[threads] = b["bytes_per_second"]
    return res


def cpu_name():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--quick", action="store_true", help="stories260K and 15M only")
    args = ap.parse_args()
    build = os.path.abspath(args.build)
    spillway = os.path.join(build, "spillway")

    models = [("stories260K (F32)", os.path.join(ROOT, "models", "stories260K.gguf"))]
    models.append(("gen 15M F32", ensure_model(build, "gen-15m-f32.gguf", "15m", "f32")))
    if not args.quick:
        models.append(("gen 110M F16", ensure_model(build, "gen-110m-f16.gguf", "110m", "f16")))
        models.append(("gen 110M Q8_0", ensure_model(build, "gen-110m-q8_0.gguf", "110m", "q8_0")))
        # The K types real-world GGUF files use (Q4_K_M / Q6_K): effective
        # bandwidth counts their bytes per weight (4.5 and 6.56 bits).
        models.append(("gen 110M Q4_K", ensure_model(build, "gen-110m-q4_k.gguf", "110m", "q4_k")))
        models.append(("gen 110M Q6_K", ensure_model(build, "gen-110m-q6_k.gguf", "110m", "q6_k")))

    bw = bandwidth(build)
    prompt = os.path.join(ROOT, "bench", "prompt.txt")
    rows = []
    for label, path in models:
        for threads in (1, 2):
            j = run_json([spillway, "generate", "--json", "--model", path, "--file", prompt, "-n", str(args.tokens),
                          "--temp", "0", "--ignore-eos", "--threads", str(threads), "--ctx", "512"])
            t = j["timings"]
            eff = j["weight_bytes_per_token"] * t["decode_tokens_per_s"]
            # The estimator's host total for the same plan, against the peak RSS
            # the run measured: the CPU half of the estimate-vs-measured check.
            est = run_json([spillway, "estimate", "--json", "--model", path, "--ctx", "512", "--ubatch", "64",
                            "--threads", str(threads), "--device", "cpu"])
            est_host = next(d["total"] for d in est["devices"] if d["device"] == "host")
            rows.append((label, threads, j["n_params"], j["weight_bytes_per_token"], len(j["prompt_tokens"]),
                         t["prefill_tokens_per_s"], t["decode_tokens_per_s"], eff, eff / bw[threads],
                         t["peak_rss_bytes"], t["load_ms"], est_host))
            print(f"{label} t={threads}: prefill {t['prefill_tokens_per_s']:.1f} tok/s, decode "
                  f"{t['decode_tokens_per_s']:.1f} tok/s", file=sys.stderr)

    print(f"Machine: {cpu_name()}, {os.cpu_count()} cores; date {datetime.date.today().isoformat()}; "
          f"{args.tokens} generated tokens after a {rows[0][4]}-token prompt, greedy.")
    print()
    print(f"Measured read bandwidth (memory_bandwidth_bench): 1 thread {bw[1]/1e9:.1f} GB/s, "
          f"2 threads {bw[2]/1e9:.1f} GB/s.")
    print()
    print("| model | threads | params | weight MB/token | prompt tok | prefill tok/s | decode tok/s "
          "| effective GB/s | of bandwidth | peak RSS MiB | estimate MiB | estimate error | load ms |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        err = (r[11] - r[9]) / r[9]
        print(f"| {r[0]} | {r[1]} | {r[2]/1e6:.1f} M | {r[3]/1e6:.1f} | {r[4]} | {r[5]:.1f} | {r[6]:.1f} "
              f"| {r[7]/1e9:.2f} | {100*r[8]:.0f}% | {r[9]/2**20:.1f} | {r[11]/2**20:.1f} | {100*err:+.1f}% "
              f"| {r[10]:.1f} |")


if __name__ == "__main__":
    main()
