#!/usr/bin/env python3
"""GET /metrics of the real `spillway serve`, read by Prometheus's own parser.

Starts the server (SPILLWAY_BINARY) on the bundled model on 127.0.0.1 with a
free port and a GPU placement (lavapipe in CI; without a device the server
runs its CPU path alone and the device families are simply empty), sends a
few completions, scrapes /metrics and checks with prometheus_client's text
parser (Debian: python3-prometheus-client) that every family parses with its
declared type and that the figures agree with what was sent and with
/v1/status. Bounded: every wait has a deadline; the server is killed at the
end. Exit 0 on success, 1 with the reasons otherwise.
"""
import json
import os
import re
import shutil
import subprocess
import tempfile
import sys
import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

BINARY = os.environ.get("SPILLWAY_BINARY", "build/release/spillway")
SOURCE = os.environ.get("SPILLWAY_SOURCE_DIR", ".")
MODEL = os.path.join(SOURCE, "models", "stories260K.gguf")
N_REQUESTS = 5

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)


def http(url, body=None, timeout=60):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, r.headers, r.read().decode()


def main():
    tmp = tempfile.mkdtemp(prefix="spw-metrics-")
    # Two workers on the first path: its batching families are shown.
    server = subprocess.Popen(
        [BINARY, "serve", "--model", MODEL, "--port", "0", "--threads", "1",
         "--journal", os.path.join(tmp, "journal.sqlite"), "--device", "vulkan", "--ctx", "256", "--parallel", "2"],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        deadline = time.monotonic() + 60
        line = ""
        while time.monotonic() < deadline and "listening" not in line:
            line = server.stdout.readline()
            if not line and server.poll() is not None:
                break
        m = re.search(r"listening on (http://127\.0\.0\.1:\d+) ", line)
        if not m:
            print("server did not start: " + line, file=sys.stderr)
            return 1
        base = m.group(1)
        for i in range(N_REQUESTS):
            status, _, _ = http(base + "/v1/completions",
                                {"prompt": "Once upon a time", "max_tokens": 8 + i, "temperature": 0})
            check(status == 200, f"completion {i}: HTTP {status}")

        status, headers, text = http(base + "/metrics")
        check(status == 200, f"/metrics: HTTP {status}")
        check(headers.get("Content-Type", "").startswith("text/plain; version=0.0.4"),
              "content type " + headers.get("Content-Type", ""))
        families = {f.name: f for f in text_string_to_metric_families(text)}
        _, _, st = http(base + "/v1/status")
        state = json.loads(st)

        expected_types = {
            "spillway_requests": "counter", "spillway_queue_depth": "gauge", "spillway_queue_capacity": "gauge",
            "spillway_queue_oldest_seconds": "gauge", "spillway_running": "gauge", "spillway_workers": "gauge",
            "spillway_kv_blocks": "gauge", "spillway_queue_wait_seconds": "histogram",
            "spillway_time_to_first_token_seconds": "histogram", "spillway_decode_tokens_per_second": "histogram",
            "spillway_decisions": "counter", "spillway_ledger_bytes": "gauge", "spillway_breaker_state": "gauge",
            "spillway_breaker_trips": "counter", "spillway_device_faults": "counter",
            "spillway_device_reinitializations": "counter", "spillway_device_health_failures": "counter",
            "spillway_reservations": "gauge", "spillway_ready": "gauge",
            "spillway_batch_steps": "counter", "spillway_batch_tokens": "counter",
            "spillway_journal_rows": "gauge", "spillway_journal_bytes": "gauge",
        }
        for name, kind in expected_types.items():
            check(name in families, "missing family " + name)
            if name in families:
                check(families[name].type == kind, f"{name}: type {families[name].type}, expected {kind}")

        def samples(family, suffix="", **labels):
            f = families.get(family)
            if not f:
                return []
            return [s for s in f.samples
                    if s.name == family + suffix and all(s.labels.get(k) == v for k, v in labels.items())]

        def value(family, suffix="", **labels):
            found = samples(family, suffix, **labels)
            return sum(s.value for s in found) if found else None

        first = state["paths"][0]["name"]
        # The client requests all went to the first path (an idle server).
        check(value("spillway_decisions", "_total", kind="admit") == N_REQUESTS,
              f"admit decisions {value('spillway_decisions', '_total', kind='admit')}")
        check(value("spillway_time_to_first_token_seconds", "_count", path=first) == N_REQUESTS,
              f"TTFT count on {first}: {value('spillway_time_to_first_token_seconds', '_count', path=first)}")
        check(value("spillway_queue_wait_seconds", "_count", path=first) == N_REQUESTS,
              "queue wait count excludes the warm-up")
        for p in state["paths"]:
            done = p["requests"]["done"]
            check(value("spillway_requests", "_total", path=p["name"], outcome="done") == done,
                  f"{p['name']} done: metrics vs status {done}")
            check(value("spillway_queue_capacity", path=p["name"]) == p["queue_capacity"], "queue capacity")
            check(value("spillway_kv_blocks", path=p["name"], state="total") == p["kv"]["blocks_total"], "kv total")
        # Histograms: cumulative buckets, +Inf equals _count, _sum positive.
        for fam in ("spillway_time_to_first_token_seconds", "spillway_decode_tokens_per_second",
                    "spillway_queue_wait_seconds"):
            buckets = samples(fam, "_bucket", path=first)
            counts = [b.value for b in buckets]
            check(counts == sorted(counts), fam + ": buckets not cumulative")
            inf = [b.value for b in buckets if b.labels["le"] in ("+Inf", "inf")]
            check(inf and inf[0] == value(fam, "_count", path=first), fam + ": +Inf bucket != count")
            check((value(fam, "_sum", path=first) or 0) > 0, fam + ": zero sum")
        for ledger in state["ledgers"]:
            check(value("spillway_ledger_bytes", ledger=ledger["name"], kind="limit") == ledger["limit_bytes"],
                  "ledger limit " + ledger["name"])
        gpu = [p for p in state["paths"] if p.get("breaker")]
        for p in gpu:
            dev = p["breaker"]["name"] if "name" in p["breaker"] else None
            states = samples("spillway_breaker_state", device=dev) if dev else samples("spillway_breaker_state")
            check(sum(s.value for s in states) == 1, "exactly one breaker state is 1")
        check(value("spillway_ready") == 1, "ready")
        # The journal: one done row per client request (the server's own
        # warm-up and probes are not journaled), and a file of some pages.
        check(value("spillway_journal_rows", state="done") == N_REQUESTS,
              f"journal rows done: {value('spillway_journal_rows', state='done')}")
        check(value("spillway_journal_rows", state="running") == 0, "no journal row left running")
        check((value("spillway_journal_bytes", file="db") or 0) >= 4096, "journal file size")
        # Batching on the first path agrees with /v1/status.
        b = state["paths"][0]["batching"]
        check(b is not None, "the first path batches its two workers")
        if b:
            check(value("spillway_batch_steps", "_total", path=first) == b["steps"], "batch steps vs status")
            check(value("spillway_batch_tokens", "_total", path=first, kind="prompt") == b["prompt_tokens"],
                  "batched prompt tokens vs status")
            check(b["prompt_tokens"] > 0, "prompts went through the batched steps")
        print(f"/metrics: {len(families)} families parsed, {len(text.splitlines())} lines, "
              f"paths {[p['name'] for p in state['paths']]}")
    finally:
        server.kill()
        server.wait(timeout=30)
        shutil.rmtree(tmp, ignore_errors=True)
    if failures:
        for f in failures:
            print("FAIL: " + f, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
