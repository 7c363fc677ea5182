#!/usr/bin/env python3
"""A cross-built `spillway serve` (the aarch64 preset) answering an OpenAI
client's requests under qemu-user: what an ARM home server runs.

The engine's unit tests already run under the emulator (ctest, through
CMAKE_CROSSCOMPILING_EMULATOR); this drives the whole binary -- CLI, HTTP
server, gateway, journal, scheduler, tokenizer and kernels -- over loopback:

1. `spillway devices --json` names the expected kernel variant.
2. `spillway serve --port 0` on the bundled model starts and prints its port.
3. `/v1/status` reports that variant as the host CPU's kernels.
4. A greedy chat completion returns text; the same request streamed (SSE)
   returns the same text chunk by chunk, then [DONE].
5. A malformed request gets a 400 with an OpenAI-style error body.
6. SIGTERM stops the server with exit status 0.

Bounded: every step has a deadline and the server is killed on the way out.
Exit 0 when every check passed, else 1 with the reasons.
"""
import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request

failures = []


def check(cond, what):
    if not cond:
        failures.append(what)
        print("FAIL: " + what, flush=True)
    return cond


def request(port, path, body=None, timeout=120):
    """(status, body bytes) of a GET (body None) or a JSON POST."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=data,
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def start_server(cmd, deadline_s):
    """The server process and its port, read from its "listening on" line."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    end = time.monotonic() + deadline_s
    seen = []
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.search(r"listening on http://[^:]+:(\d+)", line)
        if m:
            return proc, int(m.group(1))
    proc.kill()
    proc.wait()
    raise RuntimeError("no 'listening on' line: " + "".join(seen)[-800:])


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--emulator", required=True, help="qemu-aarch64 (CMAKE_CROSSCOMPILING_EMULATOR)")
    ap.add_argument("--spillway", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("--variant", required=True, help="the kernel variant the emulated CPU must choose")
    ap.add_argument("--dir", required=True, help="a scratch folder for the journal")
    args = ap.parse_args()
    emu = [args.emulator]
    env = dict(os.environ)
    env.pop("SPILLWAY_CPU_VARIANT", None)

    r = subprocess.run(emu + [args.spillway, "devices", "--json"], capture_output=True, text=True, timeout=120,
                       env=env)
    if check(r.returncode == 0, f"devices exited {r.returncode}: {r.stderr[-400:]}"):
        cpu = json.loads(r.stdout)["cpu"]
        check(cpu["kernels"] == args.variant, f"devices: kernels {cpu['kernels']}, expected {args.variant}")

    os.makedirs(args.dir, exist_ok=True)
    journal = os.path.join(args.dir, "journal.db")
    if os.path.exists(journal):
        os.remove(journal)
    cmd = emu + [args.spillway, "serve", "--model", args.model, "--port", "0", "--threads", "2",
                 "--journal", journal]
    t0 = time.monotonic()
    proc, port = start_server(cmd, 120)
    try:
        print(f"serving on port {port} after {time.monotonic() - t0:.1f} s", flush=True)
        code, body = request(port, "/v1/status")
        if check(code == 200, f"/v1/status: HTTP {code}"):
            host = json.loads(body).get("host_cpu", {})
            check(host.get("kernels") == args.variant, f"/v1/status host_cpu: {host}")

        model = os.path.splitext(os.path.basename(args.model))[0]
        chat = {"model": model, "messages": [{"role": "user", "content": "Tell me a story about a cat."}],
                "max_tokens": 32, "temperature": 0}
        code, body = request(port, "/v1/chat/completions", chat)
        text = None
        if check(code == 200, f"chat completion: HTTP {code}: {body[:400]!r}"):
            choice = json.loads(body)["choices"][0]
            text = choice["message"]["content"]
            check(bool(text) and choice["finish_reason"] in ("length", "stop"), f"chat completion: {choice}")

        code, body = request(port, "/v1/chat/completions", dict(chat, stream=True))
        if check(code == 200, f"streamed chat completion: HTTP {code}: {body[:400]!r}"):
            events = [line[len("data: "):] for line in body.decode().splitlines() if line.startswith("data: ")]
            check(events and events[-1] == "[DONE]", f"stream did not end with [DONE]: {events[-3:]}")
            streamed = "".join(json.loads(e)["choices"][0]["delta"].get("content") or ""
                               for e in events if e != "[DONE]" and json.loads(e).get("choices"))
            check(text is None or streamed == text, f"streamed text differs:\n  {text!r}\n  {streamed!r}")

        code, body = request(port, "/v1/chat/completions", {"model": model})
        error = json.loads(body).get("error", {}) if body.startswith(b"{") else {}
        check(code == 400 and "messages" in error.get("message", ""),
              f"a request without messages: HTTP {code}: {body[:300]!r}")
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            rc = proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        check(rc == 0, f"server exited {rc} on SIGTERM")
    print(f"emulated serve checks took {time.monotonic() - t0:.1f} s", flush=True)
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
