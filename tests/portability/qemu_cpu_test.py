#!/usr/bin/env python3
"""The portable binary on older CPUs, emulated by qemu-user (Debian's
qemu-user: QEMU 7.2 emulates up to AVX2, not AVX-512).

First, the binary's code outside the v3/v4 kernel variants uses no AVX
register (objdump), except the runtime-checked loops named in AVX_ALLOWED.
Then for each emulated CPU -- Haswell (AVX2, FMA, F16C; no AVX-512) and Nehalem
(SSE4.2, no AVX) -- with no SPILLWAY_CPU_VARIANT set:

1. `spillway devices --json` chose the variant the CPU calls for
   (x86-64-v3, x86-64-v2), and lists every higher one as not running there;
   asking for a higher one (--cpu-variant) is refused, naming what is
   missing.
2. `spillway generate` (greedy, bundled model) gives the same tokens under
   emulation as the same variant gives natively (--cpu-variant): the
   emulated run took the right kernels, and they ran without an illegal
   instruction.
3. On Nehalem, the engine's correctness tests (the kernel, attention and
   quantised-dot tests, the engine against the double-precision reference)
   pass on the emulated CPU, on the variant it chose: every kernel path of the
   baseline runs on a CPU without AVX. Not on Haswell: its variant's tests
   already run natively (ctest's per-variant runs, on any host with AVX2),
   code outside the v3 namespace is held to the baseline by the objdump check,
   and inside it GCC's target pragma allows nothing past AVX2; check 2 runs
   its kernels under emulation. Emulated tests are this test's slowest part.

Bounded (every run has a deadline); no network. Exit 0 when every check
passed, else 1 with the reasons.
"""
import argparse
import json
import os
import subprocess
import sys
import time

# (emulated CPU, the variant it must choose, whether the test binaries run there: check 3)
CPUS = [("Haswell", "x86-64-v3", False), ("Nehalem", "x86-64-v2", True)]
# Not meaningful under emulation: qemu-user passes the host's /proc/cpuinfo
# through (the emulated CPUID disagrees with it by design), and emulated
# kernels run far below any plausible rate.
EMULATION_EXCLUDES = "-KernelVariant.CpuidAgreesWithTheKernel:KernelProbe.GivesAPlausibleRateForEachTypeTheBackendRuns"


def run(cmd, timeout, env=None):
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout} s")


def clean_env():
    env = dict(os.environ)
    env.pop("SPILLWAY_CPU_VARIANT", None)
    return env


def generate(prefix, spillway, model, extra):
    cmd = prefix + [spillway] + extra + ["generate", "--json", "--model", model, "--prompt", "Once upon a time",
                                         "-n", "48", "--temp", "0", "--threads", "2"]
    r = run(cmd, 300, clean_env())
    if r.returncode != 0:
        return None, f"exit {r.returncode}: {r.stderr.strip()[-400:]}"
    return json.loads(r.stdout)["tokens"], ""


def emulated_cpu_checks(qemu, spillway, model, reference=None, tests=(), log=print):
    """Checks 1-3 (the module's docstring) of `spillway` on each emulated CPU;
    `reference` (default: spillway itself) gives the native tokens, so a
    packaged (stripped) copy can be compared with the build's binary. Returns
    the failures, one line each."""
    failures = []

    def check(cond, what):
        if not cond:
            failures.append(what)
            print("FAIL: " + what, flush=True)
        return cond

    reference = reference or spillway
    for cpu, want, run_tests in CPUS:
        emu = [qemu, "-cpu", cpu]
        t0 = time.monotonic()
        r = run(emu + [spillway, "devices", "--json"], 120, clean_env())
        if not check(r.returncode == 0, f"{cpu}: spillway devices exited {r.returncode}: {r.stderr.strip()[-400:]}"):
            continue
        c = json.loads(r.stdout)["cpu"]
        check(c["kernels"] == want, f"{cpu}: chose {c['kernels']}, expected {want}")
        names = [v["name"] for v in c["variants"]]
        if not check(want in names, f"{cpu}: {want} not among the built variants {names}"):
            continue
        for v in c["variants"][:names.index(want)]:
            check(not v["runs_here"], f"{cpu}: {v['name']} listed as running here")
        if names.index(want) > 0:
            higher = names[names.index(want) - 1]
            r = run(emu + [spillway, "--cpu-variant", higher, "devices"], 120, clean_env())
            check(r.returncode != 0 and "lacks" in r.stderr,
                  f"{cpu}: --cpu-variant {higher} was not refused (exit {r.returncode}: {r.stderr.strip()[-300:]})")

        native, why = generate([], reference, model, ["--cpu-variant", want])
        check(native is not None, f"native generate on {want}: {why}")
        emulated, why = generate(emu, spillway, model, [])
        check(emulated is not None, f"{cpu}: generate: {why}")
        if native is not None and emulated is not None:
            check(native == emulated, f"{cpu}: tokens differ from the native {want} run:\n  {native}\n  {emulated}")

        for t in tests if run_tests else ():
            r = run(emu + [t, "--gtest_filter=" + EMULATION_EXCLUDES], 600, clean_env())
            ok = r.returncode == 0
            if "CPU kernel variant:" in r.stdout:  # the kernel tests name the variant they ran
                ok = ok and f"CPU kernel variant: {want}\n" in r.stdout
            check(ok, f"{cpu}: {os.path.basename(t)} exited {r.returncode}: {(r.stdout + r.stderr).strip()[-600:]}")
        log(f"{cpu}: {want}, {len(tests) if run_tests else 0} test binaries, {time.monotonic() - t0:.0f} s")
    return failures


# Functions outside the kernel variants that may use AVX registers: they run
# only where a runtime check allowed them (src/kv/kv_cache.cpp).
AVX_ALLOWED = ("f16_from_f32_f16c", "f16_to_f32_f16c")


def avx_outside_variants(spillway):
    """0. The functions of the (unstripped) binary that touch a YMM/ZMM or
    mask register outside the v3/v4 kernel namespaces and AVX_ALLOWED: code
    that would die on a CPU without AVX where qemu never happened to run it
    (an inline function instantiated for a variant that the linker kept for
    everyone, say). Returns their names."""
    r = run(["objdump", "-d", "--no-show-raw-insn", "-C", spillway], 300)
    if r.returncode != 0:
        return [f"objdump exited {r.returncode}: {r.stderr.strip()[-300:]}"]
    found, name = set(), ""
    for line in r.stdout.splitlines():
        if line.endswith(">:") and " <" in line:
            name = line[line.index(" <") + 2:-2]
        elif ("%ymm" in line or "%zmm" in line or "%k" in line and "kmov" in line) and name not in found:
            if "spw::cpu::x86_64_v" not in name and not any(a in name for a in AVX_ALLOWED):
                found.add(name)
    return sorted(found)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qemu", required=True)
    ap.add_argument("--spillway", required=True)
    ap.add_argument("--model", required=True)
    ap.add_argument("tests", nargs="*", help="GoogleTest binaries to run on each emulated CPU")
    args = ap.parse_args()
    leaks = avx_outside_variants(args.spillway)
    for f in leaks[:20]:
        print("FAIL: AVX register outside the kernel variants in " + f, flush=True)
    failures = leaks + emulated_cpu_checks(args.qemu, args.spillway, args.model, tests=args.tests,
                                   log=lambda line: print(line, flush=True))
    if failures:
        print(f"{len(failures)} check(s) failed", file=sys.stderr)
        return 1
    print("all checks passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
