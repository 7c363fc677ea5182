#!/usr/bin/env python3
"""The installed layout and the Debian package, from the real build directory.

1. `cmake --install` into a temporary DESTDIR with the prefix /usr (the
   package's) and with /usr/local (cmake's default): exactly the expected
   files (no test, benchmark or fuzz binary), the model and docs as in the
   source tree, the unit and config naming that prefix's paths.
2. `cpack -G DEB` into a temporary folder: dpkg-deb's fields (name, the
   project's version, architecture, section, maintainer, description), a
   Depends that names the package of every shared library the binary links,
   the contents (files, owners, modes), the conffiles, and the maintainer
   scripts run against a stub systemctl (never the real one): each succeeds,
   and calls systemd only when one is running.
3. `dpkg-deb -x` into a temporary root: the unit's ExecStart and the config's
   paths, mapped into that root (port 0, the journal in the root's
   /var/lib/spillway), started as systemd would start them; it must listen on
   127.0.0.1, map the packaged model, answer a real chat completion, journal
   it where the config says, and stop cleanly on SIGTERM.
4. `systemd-analyze verify` (and `security --offline`) on a copy of the unit
   whose paths point into that root, when systemd-analyze is installed.
5. Every commented `# key = value` example of the config is accepted by the
   real `spillway serve --config` parser.
6. The packaged binary under qemu-user as a Haswell (no AVX-512) and a
   Nehalem (no AVX): it picks the AVX2 and the baseline kernel variant, and
   generates the same tokens as the build's binary does natively on each
   (tests/portability/qemu_cpu_test.py).

Bounded (every step has a deadline), loopback only, everything in one
temporary folder that is removed at the end; the build directory's
install_manifest.txt is put back as it was. Exit 0 when every check passed,
else 1 with the reasons.
"""
import argparse
import hashlib
import json
import os
import re
import select
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request

failures = []
passed = 0


def check(cond, what):
    global passed
    if cond:
        passed += 1
    else:
        failures.append(what)
        print("FAIL: " + what, flush=True)
    return cond


def run(cmd, timeout=120, **kw):
    """Runs cmd (bounded), returns CompletedProcess with text output."""
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, **kw)
    except subprocess.TimeoutExpired:
        return subprocess.CompletedProcess(cmd, 124, "", f"timed out after {timeout} s")


def sha256(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def files_under(root):
    """Relative paths of every non-directory under root."""
    out = set()
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames:
            out.add(os.path.relpath(os.path.join(dirpath, name), root))
        for name in dirnames:  # symlinks to directories count as files
            if os.path.islink(os.path.join(dirpath, name)):
                out.add(os.path.relpath(os.path.join(dirpath, name), root))
    return out


DOCS = ["README.md", "docs/ARCHITECTURE.md", "docs/DRILL.md", "docs/PERFORMANCE.md"]
MODEL = "models/stories260K.gguf"


def expected_layout(prefix, etc):
    """Relative path -> mode, for an install under prefix (relative, e.g. 'usr')."""
    layout = {
        f"{prefix}/bin/spillway": 0o755,
        f"{prefix}/share/spillway/models/stories260K.gguf": 0o644,
        f"{prefix}/lib/systemd/system/spillway.service": 0o644,
        f"{etc}/spillway/spillway.toml": 0o644,
    }
    for d in DOCS:
        layout[f"{prefix}/share/doc/spillway/{os.path.basename(d)}"] = 0o644
    return layout


def unit_values(text):
    """Key -> list of values of a unit file (comments and sections ignored)."""
    values = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line[0] in "#;[" or "=" not in line:
            continue
        k, v = line.split("=", 1)
        values.setdefault(k.strip(), []).append(v.strip())
    return values


def check_install(args, tmp, source):
    """Step 1: cmake --install into a DESTDIR, for /usr and /usr/local."""
    model_sha = sha256(os.path.join(source, MODEL))
    for prefix, etc in (("/usr", "/etc"), ("/usr/local", "/usr/local/etc")):
        destdir = os.path.join(tmp, "destdir" + prefix.replace("/", "-"))
        r = run([args.cmake, "--install", args.build_dir, "--prefix", prefix], env={**os.environ, "DESTDIR": destdir})
        if not check(r.returncode == 0, f"cmake --install --prefix {prefix}: exit {r.returncode}: {r.stderr.strip()}"):
            continue
        layout = expected_layout(prefix.lstrip("/"), etc.lstrip("/"))
        got = files_under(destdir)
        check(got == set(layout),
              f"install --prefix {prefix}: unexpected files {sorted(got - set(layout))}, "
              f"missing {sorted(set(layout) - got)}")
        for rel, mode in layout.items():
            path = os.path.join(destdir, rel)
            if not os.path.isfile(path):
                continue
            check(stat.S_IMODE(os.stat(path).st_mode) == mode,
                  f"install --prefix {prefix}: {rel} has mode {oct(stat.S_IMODE(os.stat(path).st_mode))}, not {oct(mode)}")
        p = prefix.lstrip("/")
        model = os.path.join(destdir, p, "share/spillway/models/stories260K.gguf")
        if os.path.isfile(model):
            check(sha256(model) == model_sha, f"install --prefix {prefix}: the model differs from {MODEL}")
        for d in DOCS:
            doc = os.path.join(destdir, p, "share/doc/spillway", os.path.basename(d))
            if os.path.isfile(doc):
                check(open(doc, "rb").read() == open(os.path.join(source, d), "rb").read(),
                      f"install --prefix {prefix}: {doc} differs from {d}")
        unit = os.path.join(destdir, p, "lib/systemd/system/spillway.service")
        config = os.path.join(destdir, etc.lstrip("/"), "spillway/spillway.toml")
        if not (os.path.isfile(unit) and os.path.isfile(config)):
            continue
        if prefix == "/usr":  # the package's prefix: the files of packaging/ as they are
            for got_path, src in ((unit, "packaging/spillway.service"), (config, "packaging/spillway.toml")):
                check(open(got_path).read() == open(os.path.join(source, src)).read(),
                      f"install --prefix /usr: {got_path} differs from {src}")
        exec_start = unit_values(open(unit).read()).get("ExecStart", [""])
        check(exec_start == [f"{prefix}/bin/spillway serve --config {etc}/spillway/spillway.toml"],
              f"install --prefix {prefix}: ExecStart is {exec_start}")
        with open(config, "rb") as f:
            cfg = tomllib.load(f)
        check(cfg.get("model") == f"{prefix}/share/spillway/models/stories260K.gguf",
              f"install --prefix {prefix}: config model = {cfg.get('model')!r}")


def deb_fields(deb):
    r = run(["dpkg-deb", "--field", deb])
    fields, key = {}, None
    for line in r.stdout.splitlines():
        if line.startswith((" ", "\t")) and key:
            fields[key] += "\n" + line.strip()
        elif ":" in line:
            key, v = line.split(":", 1)
            fields[key] = v.strip()
    return fields


def library_packages(binary):
    """The Debian packages holding the shared libraries binary links (NEEDED)."""
    needed = re.findall(r"\(NEEDED\)\s+Shared library: \[([^\]]+)\]", run(["readelf", "-d", binary]).stdout)
    resolved = dict(re.findall(r"^\s*(\S+) => (/\S+)", run(["ldd", binary]).stdout, re.M))
    owners = {}
    for soname in needed:
        path = resolved.get(soname)
        owner = None
        if path:
            # dpkg knows a library under the path its package ships, /lib or /usr/lib.
            alts = {path, os.path.realpath(path)}
            for p in list(alts):
                alts.add(p[4:] if p.startswith("/usr/") else "/usr" + p)
            for p in alts:
                r = run(["dpkg", "-S", p])
                if r.returncode == 0:
                    owner = r.stdout.split(":", 1)[0].strip()
                    break
        owners[soname] = owner
    return owners


def check_maintainer_scripts(ctrl, tmp):
    """The maintainer scripts against a stub systemctl that only logs its calls."""
    stub = os.path.join(tmp, "stub-bin")
    os.makedirs(stub)
    log = os.path.join(tmp, "systemctl.log")
    with open(os.path.join(stub, "systemctl"), "w") as f:
        f.write(f'#!/bin/sh\necho "$*" >> "{log}"\n')
    os.chmod(os.path.join(stub, "systemctl"), 0o755)
    running = os.path.isdir("/run/systemd/system")
    reload = ["--system daemon-reload"] if running else []
    cases = [
        ("postinst", ["configure", ""], reload),
        ("postinst", ["configure", "0.0.1-1"], reload + (["try-restart spillway.service"] if running else [])),
        ("prerm", ["upgrade", "9.9.9-1"], []),
        ("prerm", ["remove"], (["stop spillway.service"] if running else []) + ["disable spillway.service"]),
        ("postrm", ["upgrade", "9.9.9-1"], []),
        ("postrm", ["remove"], reload),
        ("postrm", ["purge"], reload),
    ]
    for script in ("postinst", "prerm", "postrm"):
        path = os.path.join(ctrl, script)
        if not check(os.path.isfile(path), f"control archive has no {script}"):
            return
        check(stat.S_IMODE(os.stat(path).st_mode) == 0o755, f"{script} is not mode 0755")
        r = run(["sh", "-n", path])
        check(r.returncode == 0, f"{script}: sh -n: {r.stderr.strip()}")
    env = {"PATH": stub + ":/usr/sbin:/usr/bin:/sbin:/bin", "LC_ALL": "C"}
    for script, argv, expected in cases:
        if os.path.exists(log):
            os.remove(log)
        r = run(["sh", os.path.join(ctrl, script)] + argv, timeout=30, env=env)
        calls = open(log).read().splitlines() if os.path.exists(log) else []
        check(r.returncode == 0, f"{script} {' '.join(argv)}: exit {r.returncode}: {r.stderr.strip()}")
        check(calls == expected,
              f"{script} {' '.join(argv)} (systemd {'running' if running else 'not running'}): "
              f"systemctl calls {calls}, expected {expected}")


def check_deb(args, tmp, source):
    """Step 2: the .deb built by cpack. Returns its path or None."""
    out = os.path.join(tmp, "cpack")
    r = run([args.cpack, "-G", "DEB", "--config", os.path.join(args.build_dir, "CPackConfig.cmake"), "-B", out],
            timeout=240, cwd=tmp)
    if not check(r.returncode == 0, f"cpack -G DEB: exit {r.returncode}: {r.stdout[-2000:]}{r.stderr[-2000:]}"):
        return None
    arch = run(["dpkg", "--print-architecture"]).stdout.strip()
    debs = [f for f in os.listdir(out) if f.endswith(".deb")]
    name = f"spillway_{args.version}-1_{arch}.deb"
    if not check(debs == [name], f"cpack wrote {debs}, expected [{name}]"):
        return None
    deb = os.path.join(out, name)

    f = deb_fields(deb)
    check(f.get("Package") == "spillway", f"Package: {f.get('Package')}")
    check(f.get("Version") == f"{args.version}-1", f"Version: {f.get('Version')} (project {args.version})")
    check(f.get("Architecture") == arch, f"Architecture: {f.get('Architecture')}")
    check(f.get("Section") == "net", f"Section: {f.get('Section')}")
    check(f.get("Priority") == "optional", f"Priority: {f.get('Priority')}")
    check(re.fullmatch(r"[^<>]+ <[^@<>\s]+@[^<>\s]+>", f.get("Maintainer", "")) is not None,
          f"Maintainer: {f.get('Maintainer')!r}")
    desc = f.get("Description", "").split("\n")
    check(len(desc) >= 3 and desc[0] and all(desc), f"Description has no synopsis and extended text: {desc}")

    ctrl = os.path.join(tmp, "control")
    r = run(["dpkg-deb", "--control", deb, ctrl])
    check(r.returncode == 0, f"dpkg-deb --control: {r.stderr.strip()}")
    conffiles = open(os.path.join(ctrl, "conffiles")).read().split() if os.path.isfile(os.path.join(ctrl, "conffiles")) else []
    check(conffiles == ["/etc/spillway/spillway.toml"], f"conffiles: {conffiles}")
    check_maintainer_scripts(ctrl, tmp)

    # Contents: exactly the layout of a /usr install, owned by root.
    layout = expected_layout("usr", "etc")
    contents = {}
    for line in run(["dpkg-deb", "--contents", deb]).stdout.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and not parts[0].startswith("d"):
            path = parts[5].split(" -> ")[0]
            contents[path[2:] if path.startswith("./") else path] = (parts[0], parts[1])
    check(set(contents) == set(layout),
          f"package contents: unexpected {sorted(set(contents) - set(layout))}, missing {sorted(set(layout) - set(contents))}")
    for path, (perms, owner) in contents.items():
        want = "-rwxr-xr-x" if layout.get(path) == 0o755 else "-rw-r--r--"
        check(perms == want and owner == "root/root", f"package: {path} is {perms} {owner}, expected {want} root/root")
    for c in conffiles:
        check(c.lstrip("/") in contents, f"conffile {c} is not in the package")

    # Depends names the package of each library the packaged binary links.
    root = os.path.join(tmp, "root")
    r = run(["dpkg-deb", "-x", deb, root])
    if not check(r.returncode == 0, f"dpkg-deb -x: {r.stderr.strip()}"):
        return None
    depends = {re.split(r"[\s(:]", d.strip(), maxsplit=1)[0]
               for alt in f.get("Depends", "").split(",") for d in alt.split("|") if d.strip()}
    for soname, owner in library_packages(os.path.join(root, "usr/bin/spillway")).items():
        check(owner is not None, f"no Debian package found for {soname}, which the binary links")
        if owner:
            check(owner in depends, f"Depends lacks {owner} (for {soname}): {f.get('Depends')}")
    # The extracted files are the ones of the tree (the binary is stripped).
    packaged_model = os.path.join(root, "usr/share/spillway/models/stories260K.gguf")
    check(os.path.isfile(packaged_model) and sha256(packaged_model) == sha256(os.path.join(source, MODEL)),
          "the packaged model is missing or differs from " + MODEL)
    for got, src in (("usr/lib/systemd/system/spillway.service", "packaging/spillway.service"),
                     ("etc/spillway/spillway.toml", "packaging/spillway.toml")):
        if not check(os.path.isfile(os.path.join(root, got)), f"the package has no {got}"):
            return None
        check(open(os.path.join(root, got)).read() == open(os.path.join(source, src)).read(),
              f"packaged {got} differs from {src}")
    return root


def read_ready_line(proc, deadline):
    """The first stdout line of proc, read without blocking past deadline."""
    buf = b""
    fd = proc.stdout.fileno()
    while b"\n" not in buf and time.monotonic() < deadline:
        ready, _, _ = select.select([fd], [], [], 0.1)
        if ready:
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            buf += chunk
        elif proc.poll() is not None:
            break
    return buf.split(b"\n", 1)[0].decode(errors="replace")


def http(url, body=None, timeout=30):
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")


def check_serve(root, tmp):
    """Step 3: the extracted package, started as its unit says. Returns the unit copy's text."""
    unit_text = open(os.path.join(root, "usr/lib/systemd/system/spillway.service")).read()
    unit = unit_values(unit_text)
    for key, want in (("DynamicUser", "yes"), ("StateDirectory", "spillway"), ("ConfigurationDirectory", "spillway"),
                      ("ProtectSystem", "strict"), ("PrivateTmp", "yes"), ("NoNewPrivileges", "yes"),
                      ("Restart", "on-failure")):
        check(unit.get(key) == [want], f"unit: {key}={unit.get(key)}, expected {want}")
    check(unit.get("ProtectHome") in (["yes"], ["read-only"]), f"unit: ProtectHome={unit.get('ProtectHome')}")
    check(unit.get("PrivateDevices") in (None, ["no"]), "unit: PrivateDevices hides the GPU device nodes")
    argv = shlex.split(unit.get("ExecStart", [""])[0])
    if not check(len(argv) >= 4 and argv[0] == "/usr/bin/spillway" and argv[1] == "serve" and "--config" in argv,
                 f"unit: ExecStart {argv}"):
        return None
    config_path = argv[argv.index("--config") + 1]
    check(config_path == "/etc/spillway/spillway.toml", f"unit: --config {config_path}")
    state_dir = "/var/lib/" + unit.get("StateDirectory", ["?"])[0]

    # The config as packaged: the bundled model's installed path, loopback, the
    # journal in the unit's state directory.
    config_file = root + config_path
    text = open(config_file).read()
    cfg = tomllib.loads(text)
    model = cfg.get("model", "")
    check(model == "/usr/share/spillway/models/stories260K.gguf", f"config: model = {model!r}")
    check(os.path.isfile(root + model), f"config: model {model} is not in the package")
    check(cfg.get("host") == "127.0.0.1", f"config: host = {cfg.get('host')!r}")
    check(cfg.get("port") == 8080, f"config: port = {cfg.get('port')!r}")
    journal = cfg.get("journal", "")
    check(journal.startswith(state_dir + "/"), f"config: journal {journal!r} is not in the StateDirectory {state_dir}")

    # Every absolute path mapped into the root, port 0; written back in place
    # of the extracted config, so that ExecStart's --config names it.
    def set_key(text, key, value):
        new, n = re.subn(rf"^{re.escape(key)}\s*=.*$", f"{key} = {value}", text, flags=re.M)
        check(n == 1, f"config: {n} lines set {key}")
        return new
    text = set_key(text, "model", json.dumps(root + model))
    text = set_key(text, "journal", json.dumps(root + journal))
    text = set_key(text, "port", "0")
    with open(config_file, "w") as f:
        f.write(text)
    os.makedirs(os.path.dirname(root + journal), exist_ok=True)  # systemd's StateDirectory
    cache = root + "/var/cache/spillway"
    os.makedirs(cache, exist_ok=True)
    home = os.path.join(tmp, "home")
    cwd = os.path.join(tmp, "cwd")
    os.makedirs(home)
    os.makedirs(cwd)
    cmd = [root + argv[0]] + [root + a if a == config_path else a for a in argv[1:]]
    env = {**os.environ, "HOME": home, "XDG_CACHE_HOME": cache, "XDG_STATE_HOME": os.path.join(home, "state")}
    err_path = os.path.join(tmp, "serve.stderr")
    started = time.monotonic()
    with open(err_path, "w") as err:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=err, stdin=subprocess.DEVNULL, cwd=cwd, env=env)
    try:
        line = read_ready_line(proc, time.monotonic() + 60)
        m = re.match(r"^spillway: listening on http://127\.0\.0\.1:(\d+) model=(\S+) ", line)
        if not check(m is not None, f"the packaged server did not listen on 127.0.0.1: {line!r}"):
            return unit_text
        base = f"http://127.0.0.1:{m.group(1)}"
        print(f"packaging: {' '.join(cmd)} listening on {base} after {time.monotonic() - started:.1f} s", flush=True)
        check(m.group(2) == "stories260K", f"ready line model={m.group(2)}")
        maps = open(f"/proc/{proc.pid}/maps").read()
        check(root + model in maps, f"the server does not map the packaged model {root + model}")
        status, _ = http(base + "/health/ready")
        check(status == 200, f"/health/ready: HTTP {status}")
        status, body = http(base + "/v1/chat/completions",
                            {"messages": [{"role": "user", "content": "Tell me a story"}],
                             "max_tokens": 16, "temperature": 0}, timeout=60)
        if check(status == 200, f"chat completion: HTTP {status}: {body[:500]}"):
            r = json.loads(body)
            content = r["choices"][0]["message"]["content"]
            check(r.get("object") == "chat.completion" and r.get("model") == "stories260K",
                  f"chat completion: object {r.get('object')}, model {r.get('model')}")
            check(isinstance(content, str) and content.strip() != "", f"chat completion: empty answer {content!r}")
            check(1 <= r["usage"]["completion_tokens"] <= 16, f"chat completion: usage {r['usage']}")
            print(f"packaging: chat completion: {content!r}", flush=True)
            rid = r["spillway"]["request_id"]
            check(os.path.isfile(root + journal), f"no journal at {root + journal}")
            status, body = http(f"{base}/v1/requests/{rid}")
            check(status == 200 and json.loads(body).get("state") == "done",
                  f"GET /v1/requests/{rid}: HTTP {status}: {body[:300]}")
        proc.send_signal(signal.SIGTERM)  # what `systemctl stop` sends
        try:
            code = proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            code = None
        check(code == 0, f"the server's exit after SIGTERM: {code}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        proc.stdout.close()
        if failures:
            print("---- server stderr\n" + open(err_path).read(), flush=True)
    return unit_text


def check_unit(root, tmp, unit_text):
    """Step 4: systemd-analyze on a copy of the unit with its paths in root."""
    if shutil.which("systemd-analyze") is None:
        print("packaging: systemd-analyze not installed (Debian package systemd): unit not verified", flush=True)
        return
    udir = os.path.join(tmp, "unit")
    os.makedirs(udir)
    text = unit_text.replace("ExecStart=/usr/bin/spillway serve --config /etc/spillway/spillway.toml",
                             f"ExecStart={root}/usr/bin/spillway serve --config {root}/etc/spillway/spillway.toml")
    check(text != unit_text, "unit: ExecStart not found to map into the root")
    unit = os.path.join(udir, "spillway.service")
    with open(unit, "w") as f:
        f.write(text)
    # verify exits 0 on unknown keys and bad values (it warns and ignores
    # them), so any line about the unit is a failure.
    r = run(["systemd-analyze", "verify", "--man=no", unit], timeout=60)
    out = (r.stdout + r.stderr).strip()
    check(r.returncode == 0 and "spillway" not in out, f"systemd-analyze verify: exit {r.returncode}: {out}")
    print(f"packaging: systemd-analyze verify: exit {r.returncode}{': ' + out if out else ''}", flush=True)
    if "--offline" in run(["systemd-analyze", "--help"]).stdout:
        # 1.8 ("OK") on systemd 252; a protection dropped pushes it past 2.5.
        r = run(["systemd-analyze", "security", "--offline=true", "--threshold=25", "--no-pager", unit], timeout=60)
        level = re.search(r"Overall exposure level for \S+: (.*)", r.stdout)
        print(f"packaging: systemd-analyze security: {level.group(1) if level else r.stdout[-300:]}", flush=True)
        check(r.returncode == 0, f"systemd-analyze security: exposure above 2.5: {level.group(1) if level else r.stderr}")


def check_config_examples(root, tmp, source):
    """Step 5: each commented `# key = value` line of the config, alone, through the real parser."""
    binary = os.path.join(root, "usr/bin/spillway")
    examples = re.findall(r"^# ([a-z][a-z0-9-]*) = (.+)$", open(os.path.join(source, "packaging/spillway.toml")).read(), re.M)
    check(len(examples) >= 8, f"only {len(examples)} commented examples in packaging/spillway.toml")
    for i, (key, value) in enumerate(examples):
        path = os.path.join(tmp, f"example-{i}.toml")
        with open(path, "w") as f:
            f.write(f"{key} = {value}\n")
        # --dump-config applies the file (types and validators) and prints
        # every setting without loading a model.
        r = run([binary, "serve", "--config", path, "--dump-config"], timeout=30)
        check(r.returncode == 0, f"config example `{key} = {value}` refused: {r.stderr.strip()}")
        check(re.search(rf"^{re.escape(key)} = ", r.stdout, re.M) is not None, f"--dump-config lacks {key}")


def check_emulated_cpus(args, root, source):
    """6. The packaged binary on emulated older CPUs (tests/portability's
    checks 1-2: the variant chosen, the same tokens as the build's binary on
    that variant natively), where the build has the x86-64 kernel variants
    and qemu-user is installed."""
    binary = os.path.join(root, "usr/bin/spillway")
    qemu = shutil.which("qemu-x86_64")
    r = run([os.path.join(args.build_dir, "spillway"), "devices", "--json"])
    variants = [v["name"] for v in json.loads(r.stdout).get("cpu", {}).get("variants", [])] if r.returncode == 0 else []
    if "x86-64-v3" not in variants or qemu is None:
        print(f"packaging: emulated CPUs not checked ({'no qemu-x86_64' if qemu is None else 'a native build'})",
              flush=True)
        return
    sys.path.insert(0, os.path.join(source, "tests", "portability"))
    from qemu_cpu_test import emulated_cpu_checks  # noqa: E402
    found = emulated_cpu_checks(qemu, binary, os.path.join(source, "models", "stories260K.gguf"),
                                reference=os.path.join(args.build_dir, "spillway"), log=lambda line: None)
    for f in found:
        check(False, "packaged binary: " + f)
    check(not found, "packaged binary on emulated CPUs")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build-dir", required=True)
    ap.add_argument("--source-dir", required=True)
    ap.add_argument("--version", required=True)
    ap.add_argument("--cmake", default="cmake")
    ap.add_argument("--cpack", default="cpack")
    args = ap.parse_args()
    args.build_dir = os.path.abspath(args.build_dir)
    source = os.path.abspath(args.source_dir)
    for tool in ("dpkg-deb", "dpkg-shlibdeps", "readelf", "ldd", "file"):
        if shutil.which(tool) is None:
            print(f"packaging: {tool} is missing (scripts/setup installs it)", file=sys.stderr)
            return 1

    manifest = os.path.join(args.build_dir, "install_manifest.txt")
    saved_manifest = open(manifest, "rb").read() if os.path.exists(manifest) else None
    tmp = tempfile.mkdtemp(prefix="spw-packaging-")
    t0 = time.monotonic()
    try:
        check_install(args, tmp, source)
        print(f"packaging: cmake --install layout checked ({time.monotonic() - t0:.1f} s)", flush=True)
        root = check_deb(args, tmp, source)
        print(f"packaging: cpack -G DEB package checked ({time.monotonic() - t0:.1f} s)", flush=True)
        if root:
            unit_text = check_serve(root, tmp)
            print(f"packaging: the extracted package served a chat completion ({time.monotonic() - t0:.1f} s)", flush=True)
            if unit_text:
                check_unit(root, tmp, unit_text)
            check_config_examples(root, tmp, source)
            print(f"packaging: config examples checked ({time.monotonic() - t0:.1f} s)", flush=True)
            check_emulated_cpus(args, root, source)
            print(f"packaging: emulated CPUs checked ({time.monotonic() - t0:.1f} s)", flush=True)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        if saved_manifest is None:
            if os.path.exists(manifest):
                os.remove(manifest)
        else:
            with open(manifest, "wb") as f:
                f.write(saved_manifest)
    if failures:
        print(f"packaging: {len(failures)} of {passed + len(failures)} checks failed:", file=sys.stderr)
        for f in failures:
            print("  " + f, file=sys.stderr)
        return 1
    print(f"packaging: all {passed} checks passed in {time.monotonic() - t0:.1f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
