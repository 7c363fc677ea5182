// What the npm acceptance tests share: the environment ctest sets, the
// official openai client from tests/npm/node_modules (a clear failure when it
// is missing), and bounded waits. Imported by every *.test.mjs here.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { createRequire } from 'node:module';

export const BINARY = process.env.SPILLWAY_BINARY;
export const SOURCE_DIR = process.env.SPILLWAY_SOURCE_DIR;
if (!BINARY || !SOURCE_DIR) {
  throw new Error('set SPILLWAY_BINARY (the spillway binary) and SPILLWAY_SOURCE_DIR (the repository root)');
}

// Under a sanitizer everything is several times slower: waits scale.
export const SLOWDOWN = process.env.SPILLWAY_SANITIZE ? 4 : 1;

export const MODEL = path.join(SOURCE_DIR, 'models', 'stories260K.gguf');

async function loadOpenAI() {
  try {
    const require = createRequire(path.join(SOURCE_DIR, 'tests', 'npm', 'package.json'));
    return (await import(require.resolve('openai'))).default;
  } catch (e) {
    throw new Error(
      `the openai npm package is not installed in ${path.join(SOURCE_DIR, 'tests', 'npm', 'node_modules')}: ` +
        `run scripts/setup or (cd tests/npm && npm install --no-audit --no-fund --no-package-lock) [${e.message}]`);
  }
}
export const OpenAI = await loadOpenAI();

// A promise with a deadline: rejects naming `what` after `ms` x `scale`.
export function bounded(promise, ms, what, scale = 1) {
  let timer;
  const deadline = new Promise((_, reject) => {
    timer = setTimeout(() => reject(new Error(`timed out after ${ms * scale} ms: ${what}`)), ms * scale);
  });
  return Promise.race([promise, deadline]).finally(() => clearTimeout(timer));
}

export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

// `spillway` with argv (a verb and its flags) as a child process; resolves
// once its "listening on" line names the port: { proc, stdout, stderr,
// exited (a promise of the exit code), exitCode (undefined while running),
// ready (the line), base (its URL) }. Bounded by `ms` (scaled).
export async function spawnServer(name, argv, ms = 120_000) {
  const srv = { name, stdout: '', stderr: '', exitCode: undefined };
  srv.proc = spawn(BINARY, argv, { stdio: ['ignore', 'pipe', 'pipe'] });
  srv.exited = new Promise((resolve) => srv.proc.on('exit', (code, signal) => {
    srv.exitCode = code === null ? `signal ${signal}` : code;
    resolve(srv.exitCode);
  }));
  srv.proc.stderr.setEncoding('utf8');
  srv.proc.stderr.on('data', (d) => { srv.stderr += d; });
  srv.proc.stdout.setEncoding('utf8');
  const m = await bounded(new Promise((resolve, reject) => {
    srv.proc.stdout.on('data', (d) => {
      srv.stdout += d;
      const got = srv.stdout.match(/^spillway: listening on http:\/\/127\.0\.0\.1:(\d+) .*$/m);
      if (got) resolve(got);
    });
    srv.exited.then((c) => reject(new Error(`server ${name} exited (${c}) before listening:\n${srv.stdout}\n${srv.stderr}`)));
  }), ms, `server ${name}: the "listening on" line`, SLOWDOWN);
  srv.ready = m[0];
  srv.base = `http://127.0.0.1:${m[1]}`;
  return srv;
}

// SIGKILL, then wait (bounded) for the exit.
export async function killServer(srv) {
  if (srv && srv.exitCode === undefined) {
    srv.proc.kill('SIGKILL');
    await bounded(srv.exited, 10_000, `server ${srv.name}: SIGKILL`, SLOWDOWN).catch(() => {});
  }
}

// Arms a slow fault on a server's cpu path through the admin API (each
// forward pass takes `factor` times its time, count 0: until disarmed), so
// that a queue stays queued while a test acts on it, however fast the
// machine; resolves with a function that disarms it. The server runs with
// --admin-token `token`.
export async function slowCpuPath(base, token, factor = 20) {
  const headers = { authorization: `Bearer ${token}`, 'content-type': 'application/json' };
  const r = await fetch(`${base}/v1/admin/faults`, {
    method: 'POST', headers, body: JSON.stringify({ kind: 'slow', path: 'cpu', factor, count: 0 }),
  });
  if (r.status !== 201) throw new Error(`arming a slow fault on the cpu path: HTTP ${r.status} ${await r.text()}`);
  return async () => {
    const d = await fetch(`${base}/v1/admin/faults`, { method: 'DELETE', headers });
    if (d.status !== 200) throw new Error(`disarming the faults: HTTP ${d.status} ${await d.text()}`);
  };
}

// JSON over fetch with a deadline: status, parsed body (undefined when it is
// not JSON), raw text and headers.
export async function call(srv, method, route, body, headers = {}) {
  const r = await fetch(srv.base + route, {
    method,
    headers: { ...(body === undefined ? {} : { 'content-type': 'application/json' }), ...headers },
    body: body === undefined ? undefined : JSON.stringify(body),
    signal: AbortSignal.timeout(60_000 * SLOWDOWN),
  });
  const text = await r.text();
  let json;
  try { json = JSON.parse(text); } catch { json = undefined; }
  return { status: r.status, json, text, headers: r.headers };
}
