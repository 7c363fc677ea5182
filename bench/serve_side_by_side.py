#!/usr/bin/env python3
"""Concurrent streams over HTTP: `spillway serve` side by side with another
OpenAI-compatible server (llama.cpp's `llama-server`) on the same GGUF.

For each stream count N (default 1, 2, 4, 8) both servers are started with
N parallel slots, the same threads and context per slot, and each gets N
concurrent streaming `/v1/completions` requests (greedy, --tokens each, a
different short prompt per stream), one server at a time and alternating
(A B B A ...) over --reps rounds. Per run: aggregate tokens/s = text chunks
of all streams / (last token event - submit), and the inter-token latency
between a stream's consecutive token events (all streams pooled, p50 and
p99). Tokens are the server's usage figure when it sends one, else its token
events. Every stream's count is printed so a run whose model stopped early
is seen.
A final table gives medians and the Spillway / other ratio.

The other server is optional and never built or fetched here: pass the path
of a binary you built (--llama-server PATH). Without it only Spillway runs.
Loopback only; every server is stopped at the end.

Usage:
  bench/serve_side_by_side.py --model build/bench-models/recovery-110m-q8_0.gguf \
      [--llama-server /path/to/llama-server] [--threads 2] [--tokens 128] \
      [--streams 1,2,4,8] [--reps 2] [--build build/release]
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PROMPTS = ["Once upon a time", "The little dog", "Lily and Ben went to the park", "One day",
           "The sun was shining", "Tom had a red ball", "In a small town", "The cat sat"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(port, path, proc, timeout=120):
    deadline = time.time() + timeout
    while time.time() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            c.request("GET", path)
            if c.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise RuntimeError("server did not become ready")


class Server:
    def __init__(self, name, argv, port, health, extra_body):
        self.name, self.argv, self.port, self.health, self.extra_body = name, argv, port, health, extra_body
        self.proc = None

    def __enter__(self):
        self.proc = subprocess.Popen(self.argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_ready(self.port, self.health, self.proc)
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def spillway(args, n):
    port = free_port()
    argv = [os.path.join(args.build, "spillway"), "serve", "--model", args.model, "--host", "127.0.0.1",
            "--port", str(port), "--parallel", str(n), "--threads", str(args.threads), "--ctx", str(args.ctx),
            "--journal", "none", "--no-cpu-fallback"]
    return Server("spillway", argv, port, "/health", {"stream_options": {"include_usage": True}})


def llama(args, n):
    port = free_port()
    argv = [args.llama_server, "-m", args.model, "--host", "127.0.0.1", "--port", str(port), "-t", str(args.threads),
            "-tb", str(args.threads), "-np", str(n), "-c", str(args.ctx * n), "--no-warmup"]
    return Server("llama.cpp", argv, port, "/health", {"ignore_eos": True})


def stream(port, body, out):
    """One streaming request: the arrival time of every text chunk."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=300)
    c.request("POST", "/v1/completions", json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    if r.status != 200:
        out["error"] = f"HTTP {r.status}: {r.read()[:200]!r}"
        return
    times = []
    for raw in r:
        line = raw.strip()
        if not line.startswith(b"data:"):
            continue
        data = line[5:].strip()
        if data == b"[DONE]":
            break
        ev = json.loads(data)
        ch = ev.get("choices") or []
        # One event per generated token (its text may be empty while a
        # multi-byte character or a stop-string prefix is held back); the
        # last one carries the finish reason, and usage when the server
        # sends it.
        if ch and ch[0].get("finish_reason") is None:
            times.append(time.perf_counter())
        if ev.get("usage"):
            out["tokens"] = ev["usage"]["completion_tokens"]
    out["times"] = times
    out.setdefault("tokens", len(times))


def run(server, n, tokens, model):
    # The served model's name: its file's stem (spillway answers 404 for a
    # name it does not serve; llama-server takes any).
    name = os.path.splitext(os.path.basename(model))[0]
    bodies = [dict({"model": name, "prompt": PROMPTS[i % len(PROMPTS)], "max_tokens": tokens, "temperature": 0,
                    "stream": True}, **server.extra_body) for i in range(n)]
    # One warm-up request per server start.
    warm = {}
    stream(server.port, dict(bodies[0], max_tokens=4), warm)
    outs = [{} for _ in range(n)]
    t0 = time.perf_counter()
    threads = [threading.Thread(target=stream, args=(server.port, bodies[i], outs[i])) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    errors = [o["error"] for o in outs if "error" in o]
    if errors:
        raise RuntimeError(f"{server.name}: {errors[0]}")
    counts = [o["tokens"] for o in outs]
    last = max(o["times"][-1] for o in outs if o["times"])
    gaps = [b - a for o in outs for a, b in zip(o["times"], o["times"][1:])]
    gaps.sort()

    def pct(p):
        return 1000 * gaps[min(len(gaps) - 1, int(p * (len(gaps) - 1) + 0.5))] if gaps else 0.0

    return {"tps": sum(counts) / (last - t0), "counts": counts, "itl_p50": pct(0.5), "itl_p99": pct(0.99)}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True)
    ap.add_argument("--build", default=os.path.join(ROOT, "build", "release"))
    ap.add_argument("--llama-server", help="path of a llama-server binary built elsewhere (optional)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--ctx", type=int, default=2048, help="positions per slot")
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--streams", default="1,2,4,8")
    ap.add_argument("--reps", type=int, default=2)
    args = ap.parse_args()
    makers = [spillway] + ([llama] if args.llama_server else [])
    results = {}
    for rep in range(args.reps):
        for n in [int(x) for x in args.streams.split(",")]:
            order = makers if rep % 2 == 0 else list(reversed(makers))
            for make in order:
                with make(args, n) as srv:
                    r = run(srv, n, args.tokens, args.model)
                results.setdefault((srv.name, n), []).append(r)
                print(f"round {rep} streams {n} {srv.name}: {r['tps']:.1f} tok/s, ITL p50 {r['itl_p50']:.1f} "
                      f"p99 {r['itl_p99']:.1f} ms, tokens per stream {r['counts']}", file=sys.stderr, flush=True)
    names = [m(args, 1).name for m in makers]
    print(f"\n| streams | " + " | ".join(f"{x} tok/s" for x in names) +
          (" | ratio |" if len(names) > 1 else " |") + " " + " | ".join(f"{x} ITL p50 / p99 ms" for x in names) + " |")
    print("|---" * (1 + len(names) + (1 if len(names) > 1 else 0) + len(names)) + "|")
    for n in [int(x) for x in args.streams.split(",")]:
        tps = {x: [r["tps"] for r in results[(x, n)]] for x in names}
        cells = [", ".join(f"{v:.1f}" for v in tps[x]) for x in names]
        ratio = []
        if len(names) > 1:
            ratio = [", ".join(f"{a / b:.2f}" for a, b in zip(tps[names[0]], tps[names[1]]))]
        itl = [f"{statistics.median(r['itl_p50'] for r in results[(x, n)]):.1f} / "
               f"{statistics.median(r['itl_p99'] for r in results[(x, n)]):.1f}" for x in names]
        print(f"| {n} | " + " | ".join(cells + ratio + itl) + " |")


if __name__ == "__main__":
    main()
