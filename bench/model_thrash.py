#!/usr/bin/env python3
"""Reload thrash between two models that cannot both fit (issue 32).

Two catalogue models of one `spillway serve` (CPU placement, the host
ledger's budget capped with --host-budget so that one of them fits at a
time beside the served model) and two clients in closed loops: client A
asks model A only, client B model B only, --requests each, greedy,
--tokens per request. The same run is made for each --min-residency-s value
(0: the rule off, every request may evict the other model), alternating
over --reps rounds. Per run: loads per 100 requests (from /v1/models: the
sum of both models' loads), wall time, completion tokens/s over all
requests, and each client's request latency p50/p99. A final table gives the
medians.

The budget is measured, not guessed: a first server with room for both
reports each model's host plan (/v1/models memory_by_ledger), and the runs
cap the budget at 1.5 times the larger plan. Loopback only; every server is
stopped at the end.

Usage:
  bench/model_thrash.py --models A.gguf,B.gguf [--build build/release] \
      [--min-residency 0,5] [--requests 50] [--tokens 16] [--reps 2] [--threads 1]
"""
import argparse
import http.client
import json
import os
import statistics
import subprocess
import sys
import threading
import time

from serve_side_by_side import free_port, wait_ready  # bench/: the same ways to pick a port and wait

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SERVED = os.path.join(ROOT, "models", "stories260K.gguf")


def request(port, method, path, body=None, timeout=600):
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    c.request(method, path, body=None if body is None else json.dumps(body),
              headers={} if body is None else {"content-type": "application/json"})
    r = c.getresponse()
    data = r.read()
    c.close()
    return r.status, json.loads(data) if data else None


def start(binary, models, threads, extra):
    port = free_port()
    args = [binary, "serve", "--model", SERVED, "--port", str(port), "--threads", str(threads),
            "--journal", "none", "--ctx", "512", "--keep-alive", "10m"]
    for name, path in models:
        args += ["--model", f"{name}={path}"]
    proc = subprocess.Popen(args + extra, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_ready(port, "/health/ready", proc)
    except RuntimeError as e:
        proc.kill()
        raise RuntimeError(f"{e}: {' '.join(args + extra)}") from None
    return proc, port


def stop(proc):
    proc.terminate()
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()


def models_state(port):
    _, j = request(port, "GET", "/v1/models")
    return {m["id"]: m["spillway"] for m in j["data"]}


def run(binary, models, threads, min_residency, budget, n_requests, tokens):
    proc, port = start(binary, models, threads,
                       ["--host-budget", str(budget), "--min-residency-s", str(min_residency)])
    try:
        latencies = {name: [] for name, _ in models}
        completion = [0]
        errors = []
        lock = threading.Lock()

        def client(name):
            for i in range(n_requests):
                t0 = time.time()
                status, j = request(port, "POST", "/v1/completions",
                                    {"model": name, "prompt": "Once upon a time", "max_tokens": tokens,
                                     "temperature": 0, "ignore_eos": True})
                with lock:
                    if status != 200:
                        errors.append(f"{name} #{i}: HTTP {status} {j}")
                        continue
                    latencies[name].append(time.time() - t0)
                    completion[0] += j["usage"]["completion_tokens"]

        t0 = time.time()
        threads_ = [threading.Thread(target=client, args=(name,)) for name, _ in models]
        for t in threads_:
            t.start()
        for t in threads_:
            t.join()
        wall = time.time() - t0
        state = models_state(port)
        loads = sum(state[name]["loads"] for name, _ in models)
        total = n_requests * len(models)
        out = {"min_residency_s": min_residency, "requests": total, "errors": len(errors), "loads": loads,
               "loads_per_100": 100.0 * loads / total, "wall_s": wall, "tokens_per_s": completion[0] / wall}
        for name, _ in models:
            lat = sorted(latencies[name])
            out[f"{name}_p50_ms"] = 1e3 * statistics.median(lat) if lat else float("nan")
            out[f"{name}_p99_ms"] = 1e3 * lat[min(len(lat) - 1, int(0.99 * len(lat)))] if lat else float("nan")
        for e in errors[:3]:
            print("  error:", e, file=sys.stderr)
        return out
    finally:
        stop(proc)


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", required=True, help="two GGUF files, comma-separated (served as A and B)")
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--min-residency", default="0,5", help="values of --min-residency-s to compare")
    ap.add_argument("--requests", type=int, default=50, help="requests per client")
    ap.add_argument("--tokens", type=int, default=16)
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    a = ap.parse_args()
    binary = os.path.join(a.build, "spillway")
    paths = a.models.split(",")
    if len(paths) != 2:
        sys.exit("--models takes two files")
    models = [("A", os.path.abspath(paths[0])), ("B", os.path.abspath(paths[1]))]

    # The plans, with room for both.
    proc, port = start(binary, models, a.threads, [])
    try:
        state = models_state(port)
        plan = max(state[n]["memory_by_ledger"]["host"] for n, _ in models)
    finally:
        stop(proc)
    budget = int(1.5 * plan)
    print(f"host plans: A {state['A']['memory_by_ledger']['host']} B, B {state['B']['memory_by_ledger']['host']} B; "
          f"--host-budget {budget} B (one fits at a time)")

    values = [float(v) for v in a.min_residency.split(",")]
    results = {v: [] for v in values}
    for rep in range(a.reps):
        for v in (values if rep % 2 == 0 else list(reversed(values))):
            r = run(binary, models, a.threads, v, budget, a.requests, a.tokens)
            results[v].append(r)
            print(json.dumps(r), flush=True)

    keys = ["loads_per_100", "wall_s", "tokens_per_s", "A_p50_ms", "A_p99_ms", "B_p50_ms", "B_p99_ms", "errors"]
    print("\n| min residency (s) | " + " | ".join(keys) + " |")
    print("|---" * (len(keys) + 1) + "|")
    for v in values:
        med = [statistics.median(r[k] for r in results[v]) for k in keys]
        print(f"| {v:g} | " + " | ".join(f"{m:.1f}" for m in med) + " |")


if __name__ == "__main__":
    main()
