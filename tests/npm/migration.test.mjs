// Acceptance test of mid-request recovery in `spillway serve` (the real
// binary) driven by the official `openai` npm client, with faults armed
// through the admin API on a GPU path (Vulkan; lavapipe on CI):
//   - a device loss after tokens were streamed migrates the stream to the CPU
//     path (same model file, equivalence checked at start, the CPU replica in
//     the default mode: on-demand, loaded for the check and given back): the
//     client sees exactly the uninterrupted greedy text, and
//     spillway.migrations == 1; a restart on the same journal keeps the
//     verdict (no second check);
//   - an allocation failure before the first token fails over to the CPU path
//     under the same request id;
//   - with X-Spillway-Migrate: never, and on a server whose CPU path serves a
//     --fallback-model (another model, so no migration), the stream ends with
//     a resumable error event (the client throws an APIError carrying it) and
//     POST /v1/requests/{id}/resume completes it: received + continuation ==
//     the uninterrupted text. A resume while no path serves the checkpoint's
//     model (GPU out of service, CPU on the fallback model) is 503 no_path.
//
//   - two streams decoding in one batch on the GPU path (continuous
//     batching: --parallel 2) both migrate when the device is lost, and
//     batch again on the CPU path (--cpu-parallel 2): each text is exactly
//     its uninterrupted greedy text, and both paths' batching counters show
//     shared passes.
//
// Three servers: A (stories260K on GPU + CPU), B (GPU + a CPU path on a
// fallback model generated here with spillway-gen-model from the bundled
// model's tokenizer) and C (as A, two workers per path). Both: a breaker that trips on one device fault with a
// 1 s cooldown, so that the GPU is re-initialised and back in service within
// seconds after each armed fault; A runs no health checks (they allocate
// device memory and submit work, which would consume the armed faults'
// counters); B checks health every 0.2 s.
//
// Run by ctest (npm_migration_test) as `node --test tests/npm/migration.test.mjs`
// with SPILLWAY_BINARY, SPILLWAY_GEN_MODEL and SPILLWAY_SOURCE_DIR set. Every
// case skips (saying why) when the server built no GPU path (no Vulkan
// device). Every wait is bounded; servers listen on 127.0.0.1 only, port 0,
// and are killed in the after hook whatever happens.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BINARY, MODEL, OpenAI, SLOWDOWN, SOURCE_DIR, bounded as boundedBy, call, killServer, sleep, slowCpuPath, spawnServer } from './harness.mjs';

// The model generator sits next to the binary in a build tree.
const GEN_MODEL = process.env.SPILLWAY_GEN_MODEL || path.join(path.dirname(BINARY), 'spillway-gen-model');

const TOKEN = 'migration-drill-token';
const PROMPT = 'Once upon a time';
const MAX_TOKENS = 60;
// Longer than any prompt the server ran at start (warm-up, equivalence
// check, probes), so its prefill is the first to need a larger scratch
// buffer on the device: the one device-memory allocation a request makes.
const LONG_PROMPT = Array(12).fill('the little dog ran to the park').join(' ');
// On the GPU path a token costs 3 queue submissions (the prompt's first too):
// a device loss after 20 submissions hits the stream at about token 6.
const LOST_AFTER_SUBMITS = 20;

// Every deadline scales with the sanitizer's slowdown.
const bounded = (promise, ms, what) => boundedBy(promise, ms, what, SLOWDOWN);

// `spillway serve` as a child process; resolves once it listens.
async function startServer(name, args) {
  const srv = await spawnServer(name, ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
    ...args]);
  srv.gpu = /paths=gpu:vulkan/.test(srv.ready);
  srv.client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOWDOWN });
  return srv;
}

const stopServer = killServer;


const admin = { authorization: `Bearer ${TOKEN}` };

async function arm(srv, spec) {
  const r = await call(srv, 'POST', '/v1/admin/faults', { path: 'gpu', ...spec }, admin);
  assert.equal(r.status, 201, `arming ${JSON.stringify(spec)} on ${srv.name}: ${r.text}`);
  return r.json;
}

async function faults(srv) {
  const r = await call(srv, 'GET', '/v1/admin/faults', undefined, admin);
  assert.equal(r.status, 200, r.text);
  return r.json.data;
}

async function gpuPath(srv) {
  const st = await call(srv, 'GET', '/v1/status');
  assert.equal(st.status, 200, st.text);
  const gpu = st.json.paths.find((p) => p.name === 'gpu');
  assert.ok(gpu, `no gpu path in ${srv.name}'s status: ${st.text}`);
  return gpu;
}

// Polls the gpu path's status until `ok` holds (bounded); returns it.
async function waitGpu(srv, ms, what, ok) {
  const deadline = Date.now() + ms * SLOWDOWN;
  let gpu;
  for (;;) {
    gpu = await gpuPath(srv);
    if (ok(gpu)) return gpu;
    assert.ok(Date.now() < deadline,
      `${srv.name}: the gpu path was not ${what} within ${ms * SLOWDOWN} ms: ${JSON.stringify(gpu)}\n${srv.stderr.slice(-3000)}`);
    await sleep(50);
  }
}

// In service with a healthy device: recovered from any earlier fault (a
// faulted device is unhealthy until the breaker's recovery re-initialises it,
// and the breaker closes only once its probes passed).
const waitGpuInService = (srv) => waitGpu(srv, 60_000, 'back in service (breaker closed, device healthy)',
  (g) => g.breaker?.state === 'closed' && g.device?.healthy === true);

// A greedy, uninterrupted, non-streaming run on the gpu path.
async function gpuReference(srv, prompt = PROMPT, maxTokens = MAX_TOKENS) {
  const data = await bounded(
    srv.client.completions.create({ model: 'stories260K', prompt, temperature: 0, max_tokens: maxTokens }),
    60_000, `${srv.name}: the reference run`);
  assert.equal(data.spillway.path, 'gpu', `the reference must run on the gpu path: ${JSON.stringify(data.spillway)}`);
  assert.equal(data.usage.completion_tokens, maxTokens);
  return data.choices[0].text;
}

// Reads a stream to its end or its error: the text, the chunks' spillway
// objects, the finish reason, and the error the client threw (if any).
async function consume(stream, what) {
  // infoAt[i]: how much text had arrived before spillways[i]'s chunk.
  const out = { text: '', chunks: 0, textChunks: 0, spillways: [], infoAt: [], finish: null, error: null };
  await bounded((async () => {
    try {
      for await (const chunk of stream) {
        out.chunks++;
        if (chunk.spillway) {
          out.spillways.push(chunk.spillway);
          out.infoAt.push(out.text.length);
        }
        for (const c of chunk.choices ?? []) {
          if (c.text) {
            out.text += c.text;
            out.textChunks++;
          }
          if (c.finish_reason) out.finish = c.finish_reason;
        }
      }
    } catch (e) {
      out.error = e;
    }
  })(), 60_000, what);
  return out;
}

// A streamed completion of PROMPT through the client, consumed.
async function streamed(srv, headers = {}, prompt = PROMPT, maxTokens = MAX_TOKENS) {
  const { data: stream, response } = await bounded(
    srv.client.completions.create({ model: 'stories260K', prompt, temperature: 0, max_tokens: maxTokens, stream: true },
      { headers }).withResponse(),
    60_000, `${srv.name}: stream headers`);
  const out = await consume(stream, `${srv.name}: consuming the stream`);
  out.headers = response.headers;
  return out;
}

// The resumable error the client threw at the end of a stream.
function assertResumableError(out, id) {
  assert.ok(out.error, `the stream must end with an error; it ended normally after ${JSON.stringify(out.text)}`);
  assert.ok(out.error instanceof OpenAI.APIError,
    `the client throws an APIError for an SSE error event, got ${out.error.constructor.name}: ${out.error.message}`);
  const e = out.error.error;
  assert.equal(e?.code, 'resumable', `error object: ${JSON.stringify(e)}`);
  assert.equal(e.request_id, id, `error object: ${JSON.stringify(e)}`);
  assert.equal(e.resume_url, `/v1/requests/${id}/resume`, `error object: ${JSON.stringify(e)}`);
  assert.match(e.message, /resume/, JSON.stringify(e));
  return e;
}

// The breaker's counters now, for the check that a device fault ending a
// stream with a resumable error counts as one.
async function breakerCounts(srv) {
  return (await gpuPath(srv)).breaker.counts;
}

describe('migration and resume through the openai client', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `spw-npm-migration-${process.pid}-`));
  const fallbackModel = path.join(tmp, 'fallback.gguf');
  let A; // stories260K on gpu + cpu
  let B; // stories260K on gpu, a fallback model on cpu
  let C; // as A, with two workers on each path (batched)
  let reference; // the greedy text of PROMPT (MAX_TOKENS), from A's gpu path
  let aArgs; // A's flags, for its restart
  const breakerChecks = []; // { server, id, before, after }
  const t0 = performance.now();

  before(async () => {
    // The fallback model: smaller, random weights, the bundled model's
    // tokenizer (as src/gateway/builder_test.cpp makes one).
    const gen = spawnSync(GEN_MODEL, ['--out', fallbackModel, '--embd', '32', '--layers', '2', '--heads', '4',
      '--kv-heads', '2', '--ffn', '64', '--ctx', '2048', '--vocab', MODEL], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(gen.status, 0, `${GEN_MODEL} failed (${gen.error ?? ''}):\n${gen.stdout}\n${gen.stderr}`);
    const common = ['--device', 'vulkan', '--checkpoint-every', '4', '--admin-token', TOKEN,
      '--breaker-consecutive-failures', '1', '--breaker-cooldown-s', '1', '--breaker-max-cooldown-s', '1'];
    // A keeps the default replica mode: `auto`, which takes on-demand for
    // the bundled model (its load fits the recovery budget), so the
    // migration below is the one a user gets without flags.
    aArgs = [...common, '--health-interval-s', '0'];
    [A, B, C] = await Promise.all([
      startServer('A', [...aArgs, '--journal', path.join(tmp, 'a.sqlite')]),
      startServer('B', [...common, '--fallback-model', fallbackModel, '--health-interval-s', '0.2',
        '--journal', path.join(tmp, 'b.sqlite')]),
      startServer('C', [...common, '--parallel', '2', '--cpu-parallel', '2', '--replica', 'mmap',
        '--health-interval-s', '0', '--journal', path.join(tmp, 'c.sqlite')]),
    ]);
    console.log(`A: ${A.ready}\nB: ${B.ready}\nC: ${C.ready}`);
    if (A.gpu) {
      assert.match(A.stderr, /equivalence gpu <-> cpu: passed/, `A must pass its equivalence check:\n${A.stderr}`);
      const cpu = (await call(A, 'GET', '/v1/status')).json.paths.find((p) => p.name === 'cpu');
      assert.equal(cpu.replica.mode, 'on-demand', `A's cpu replica (auto): ${JSON.stringify(cpu.replica)}`);
      assert.equal(cpu.replica.loaded, false, 'loaded for the equivalence check, then given back');
    }
  });

  after(async () => {
    await Promise.all([stopServer(A), stopServer(B), stopServer(C)]);
    fs.rmSync(tmp, { recursive: true, force: true });
    console.log(`migration test: ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  });

  it('an alloc_fail before the first token is retried on the cpu path under the same request id', async (t) => {
    if (!A.gpu) return t.skip(`no gpu path (no Vulkan device): ${A.ready}`);
    await waitGpuInService(A);
    assert.deepEqual(await faults(A), []);
    await arm(A, { kind: 'alloc_fail', count: 1 });
    const out = await streamed(A, {}, LONG_PROMPT, 16);
    assert.equal(out.error, null, `the stream failed: ${out.error?.message}`);
    const fired = (await faults(A))[0];
    assert.equal(fired.fired, 1,
      `the long prompt's prefill must allocate device memory (a larger scratch buffer) and meet the armed fault: ${JSON.stringify(fired)}`);
    const id = Number(out.headers.get('x-spillway-request-id'));
    assert.ok(id > 0, `x-spillway-request-id: ${out.headers.get('x-spillway-request-id')}`);
    assert.ok(out.spillways.length >= 2, `the first and the last chunk carry a spillway object: ${JSON.stringify(out.spillways)}`);
    for (const s of out.spillways) assert.equal(s.request_id, id, `one request id throughout: ${JSON.stringify(s)}`);
    const last = out.spillways.at(-1);
    assert.equal(last.path, 'cpu', JSON.stringify(last));
    assert.equal(last.placement, 'cpu', JSON.stringify(last));
    assert.match(last.reason, /^failover from gpu after device_out_of_memory before the first token/, JSON.stringify(last));
    assert.equal(out.finish, 'length');
    assert.ok(out.text.length > 0);

    const g = await call(A, 'GET', `/v1/requests/${id}`);
    assert.equal(g.status, 200, g.text);
    assert.equal(g.json.state, 'done', g.text);
    // The same attempt, moved: attempts counts runs from the start (a retry
    // under an Idempotency-Key), not moves between paths.
    assert.equal(g.json.attempts, 1, g.text);
    assert.equal(g.json.placement, 'cpu', g.text);
    assert.equal(g.json.admission.path, 'cpu', g.text);
    assert.match(g.json.admission.reason, /^failover from gpu after device_out_of_memory/, g.text);
    assert.equal(g.json.text, out.text, g.text);
    assert.equal(g.json.usage.completion_tokens, 16, g.text);
  });

  it('a device loss mid-stream migrates the stream to the cpu path with no text repeated or skipped', async (t) => {
    if (!A.gpu) return t.skip(`no gpu path (no Vulkan device): ${A.ready}`);
    await waitGpuInService(A);
    reference = await gpuReference(A);
    await arm(A, { kind: 'device_lost', after_submits: LOST_AFTER_SUBMITS, count: 1 });
    const out = await streamed(A);
    assert.equal(out.error, null, `the stream failed: ${out.error?.message} ${JSON.stringify(out.error?.error)}`);
    assert.equal(out.text, reference, 'the migrated stream must be the uninterrupted greedy text, exactly');
    assert.equal(out.finish, 'length');
    const first = out.spillways[0];
    const last = out.spillways.at(-1);
    assert.equal(first.path, 'gpu', JSON.stringify(first));
    assert.equal(first.migrations, 0, JSON.stringify(first));
    assert.equal(last.path, 'cpu', JSON.stringify(last));
    assert.equal(last.migrations, 1, JSON.stringify(last));
    assert.equal(last.request_id, first.request_id);
    // The move is shown when it happens: the first text from the cpu path
    // comes in a chunk whose spillway object says so, not only the last one.
    const moved = out.spillways.findIndex((s) => s.path === 'cpu');
    assert.ok(moved > 0 && out.infoAt[moved] > 0 && out.infoAt[moved] < out.text.length,
      `a mid-stream chunk announces the cpu path: ${JSON.stringify(out.spillways)} at ${out.infoAt}`);
    assert.equal(out.spillways[moved].degraded, true, JSON.stringify(out.spillways[moved]));
    assert.equal(out.spillways[moved].migrations, 1, JSON.stringify(out.spillways[moved]));
    const m = last.reason.match(/^migrated from gpu after device_lost at token (\d+)/);
    assert.ok(m, `reason: ${last.reason}`);
    assert.ok(Number(m[1]) > 0 && Number(m[1]) < MAX_TOKENS, `the fault hit mid-stream: ${last.reason}`);
    assert.equal((await faults(A)).at(-1).fired, 1);

    const g = await call(A, 'GET', `/v1/requests/${first.request_id}`);
    assert.equal(g.json.state, 'done', g.text);
    assert.equal(g.json.text, reference, g.text);
    assert.equal(g.json.usage.completion_tokens, MAX_TOKENS, g.text);
    assert.equal(g.json.placement, 'cpu', g.text);
  });

  it('two streams batched on the gpu path both migrate to the cpu path and batch there, each text exact', async (t) => {
    if (!C.gpu) return t.skip(`no gpu path (no Vulkan device): ${C.ready}`);
    await waitGpuInService(C);
    const prompts = [PROMPT, 'The little dog'];
    const refs = [];
    for (const p of prompts) refs.push(await gpuReference(C, p));
    const batching = async () => {
      const st = await call(C, 'GET', '/v1/status');
      assert.equal(st.status, 200, st.text);
      return Object.fromEntries(st.json.paths.map((p) => [p.name, p.batching]));
    };
    const before = await batching();
    assert.ok(before.gpu && before.cpu, `both paths batch their two workers: ${JSON.stringify(before)}`);
    // Each batched step is 3 submissions whatever its size: 45 lands about
    // 15 steps in, when both streams decode side by side.
    // The two streams batch on the cpu path only if both are there at once:
    // each moves on its own worker thread, and on a loaded machine one can
    // be scheduled so late that the other has finished its few milliseconds
    // of cpu decoding alone (CI saw it). A slowed cpu (every forward pass
    // takes 20 times its real time) gives the later one that time.
    const disarm = await slowCpuPath(C.base, TOKEN, 20);
    let outs;
    let lost;
    try {
      await arm(C, { kind: 'device_lost', after_submits: 45, count: 1 });
      outs = await Promise.all(prompts.map((p) => streamed(C, {}, p)));
      lost = (await faults(C)).find((f) => f.kind === 'device_lost');
    } finally {
      await disarm();
    }
    const after = await batching();
    outs.forEach((out, i) => {
      assert.equal(out.error, null, `stream ${i} failed: ${out.error?.message} ${JSON.stringify(out.error?.error)}`);
      assert.equal(out.text, refs[i], `stream ${i}: the migrated text must be the uninterrupted greedy text, exactly`);
      assert.equal(out.spillways[0].path, 'gpu', JSON.stringify(out.spillways[0]));
      const last = out.spillways.at(-1);
      assert.equal(last.path, 'cpu', JSON.stringify(last));
      assert.equal(last.migrations, 1, JSON.stringify(last));
      assert.match(last.reason, /^migrated from gpu after device_lost at token \d+/, JSON.stringify(last));
    });
    assert.equal(lost?.fired, 1, JSON.stringify(lost));
    // Shared passes on both paths: more decode tokens than steps.
    for (const name of ['gpu', 'cpu']) {
      const steps = after[name].steps - before[name].steps;
      const tokens = after[name].decode_tokens - before[name].decode_tokens;
      assert.ok(steps > 0 && tokens > steps,
        `${name}: ${tokens} decode tokens in ${steps} steps: ${JSON.stringify(before[name])} -> ${JSON.stringify(after[name])}`);
      assert.ok(after[name].max_batch >= 2, JSON.stringify(after[name]));
    }
  });

  it('X-Spillway-Migrate: never ends the stream with a resumable error, and resume completes it', async (t) => {
    if (!A.gpu) return t.skip(`no gpu path (no Vulkan device): ${A.ready}`);
    await waitGpuInService(A);
    reference ??= await gpuReference(A);
    const before = await breakerCounts(A);
    await arm(A, { kind: 'device_lost', after_submits: LOST_AFTER_SUBMITS, count: 1 });
    const out = await streamed(A, { 'X-Spillway-Migrate': 'never' });
    const id = out.spillways[0]?.request_id;
    assert.ok(id > 0, JSON.stringify(out.spillways));
    const e = assertResumableError(out, id);
    breakerChecks.push({ server: 'A', id, before, after: await breakerCounts(A) });
    assert.match(e.message, /X-Spillway-Migrate: never/, JSON.stringify(e));
    assert.ok(out.text.length > 0, 'the fault must hit after tokens were streamed');
    assert.ok(reference.startsWith(out.text) && out.text.length < reference.length,
      `the text before the error is a strict prefix of the reference: ${JSON.stringify(out.text)}`);

    const rec = await call(A, 'GET', `/v1/requests/${id}`);
    assert.equal(rec.json.state, 'failed', rec.text);
    assert.equal(rec.json.resumable, true, rec.text);
    assert.equal(rec.json.error.code, 'resumable', rec.text);
    const checkpoint = rec.json.checkpoint_tokens;
    assert.ok(Number.isInteger(checkpoint) && checkpoint > 0, rec.text);

    // The client kept only part of what it got; the resume sends the rest,
    // then the continuation, in the original endpoint's chunk format.
    const kept = out.text.slice(0, 10);
    const { data: resumed, response } = await bounded(
      A.client.post(e.resume_url.replace(/^\/v1/, ''), { body: { received_text: kept, stream: true }, stream: true })
        .withResponse(),
      60_000, 'resume stream headers');
    assert.equal(response.status, 200);
    assert.equal(response.headers.get('x-spillway-resumed-at-token'), String(checkpoint));
    const more = await consume(resumed, 'consuming the resumed stream');
    assert.equal(more.error, null, `the resumed stream failed: ${more.error?.message} ${JSON.stringify(more.error?.error)}`);
    assert.equal(kept + more.text, reference, 'received + continuation must be the uninterrupted text');
    assert.equal(more.finish, 'length');
    assert.ok(more.spillways.length >= 2, JSON.stringify(more.spillways));
    for (const s of more.spillways) {
      assert.equal(s.request_id, id, JSON.stringify(s));
      assert.equal(s.resumed_at_token, checkpoint, JSON.stringify(s));
    }
    const done = await call(A, 'GET', `/v1/requests/${id}`);
    assert.equal(done.json.state, 'done', done.text);
    assert.equal(done.json.text, reference, done.text);
    assert.equal(done.json.usage.completion_tokens, MAX_TOKENS, done.text);
  });

  it('with a fallback model a mid-stream device loss is a resumable error; resume waits for the gpu path', async (t) => {
    if (!B.gpu) return t.skip(`no gpu path (no Vulkan device): ${B.ready}`);
    await waitGpuInService(B);
    const st = await call(B, 'GET', '/v1/status');
    const cpu = st.json.paths.find((p) => p.name === 'cpu');
    assert.equal(cpu.fallback_model, true, `B's cpu path serves the fallback model: ${JSON.stringify(cpu)}`);
    const ref = await gpuReference(B);
    const before = await breakerCounts(B);
    // Lost on every submission from there on, until disarmed: the gpu path
    // stays out of service (its probes fail) for as long as the test wants.
    await arm(B, { kind: 'device_lost', after_submits: 30, count: 0 });
    const out = await streamed(B);
    const id = out.spillways[0]?.request_id;
    assert.ok(id > 0, JSON.stringify(out.spillways));
    const e = assertResumableError(out, id);
    breakerChecks.push({ server: 'B', id, before, after: await breakerCounts(B) });
    assert.ok(out.text.length > 0, 'the fault must hit after tokens were streamed');
    assert.ok(ref.startsWith(out.text) && out.text.length < ref.length,
      `the text before the error is a strict prefix of the reference: ${JSON.stringify(out.text)}`);
    const rec = await call(B, 'GET', `/v1/requests/${id}`);
    assert.equal(rec.json.resumable, true, rec.text);
    const checkpoint = rec.json.checkpoint_tokens;
    assert.ok(Number.isInteger(checkpoint) && checkpoint > 0, rec.text);

    // Out of service: no path serves the checkpoint's model (the cpu path
    // serves the fallback model), so the resume is refused, saying so, and
    // the request stays resumable.
    await waitGpu(B, 20_000, 'out of service', (g) => g.breaker?.state !== 'closed');
    const refused = await call(B, 'POST', e.resume_url, { received_text: out.text, stream: false });
    assert.equal(refused.status, 503, refused.text);
    assert.equal(refused.json.error.code, 'no_path', refused.text);
    assert.match(refused.json.error.message, /serves another model/, refused.text);
    assert.ok(refused.headers.get('retry-after'), 'a 503 says when to retry');
    const still = await call(B, 'GET', `/v1/requests/${id}`);
    assert.equal(still.json.state, 'failed', still.text);
    assert.equal(still.json.resumable, true, still.text);
    assert.equal(still.json.checkpoint_tokens, checkpoint, still.text);

    // The device comes back once the fault is disarmed; then the resume runs
    // on the gpu path and completes the text.
    const d = await call(B, 'DELETE', '/v1/admin/faults', undefined, admin);
    assert.equal(d.status, 200, d.text);
    const gpu = await waitGpuInService(B);
    assert.ok(gpu.device.reinitializations >= 1, JSON.stringify(gpu.device));
    const r = await call(B, 'POST', e.resume_url, { received_text: out.text, stream: false });
    assert.equal(r.status, 200, r.text);
    assert.equal(r.json.object, 'text_completion', r.text);
    assert.equal(r.json.spillway.path, 'gpu', r.text);
    assert.equal(r.json.spillway.request_id, id, r.text);
    assert.equal(r.json.spillway.resumed_at_token, checkpoint, r.text);
    assert.equal(out.text + r.json.choices[0].text, ref, 'received + continuation must be the uninterrupted gpu text');
    assert.equal(r.json.usage.completion_tokens, MAX_TOKENS, r.text);
    assert.equal(r.json.choices[0].finish_reason, 'length', r.text);
    const done = await call(B, 'GET', `/v1/requests/${id}`);
    assert.equal(done.json.state, 'done', done.text);
    assert.equal(done.json.text, ref, done.text);
  });

  it('a restart on the same journal takes the kept equivalence verdict instead of loading and checking again', async (t) => {
    if (!A.gpu) return t.skip(`no gpu path (no Vulkan device): ${A.ready}`);
    await stopServer(A);
    A = await startServer('A', [...aArgs, '--journal', path.join(tmp, 'a.sqlite')]);
    assert.doesNotMatch(A.stderr, /equivalence gpu <-> cpu: passed, /, `A checked again:\n${A.stderr}`);
    assert.match(A.stderr, /equivalence gpu <-> cpu: passed \(kept from an earlier run\)/, A.stderr);
    const st = (await call(A, 'GET', '/v1/status')).json;
    assert.equal(st.equivalence.length, 1, JSON.stringify(st.equivalence));
    assert.equal(st.equivalence[0].passed, true, JSON.stringify(st.equivalence));
    assert.equal(st.equivalence[0].source, 'stored', JSON.stringify(st.equivalence));
    const cpu = st.paths.find((p) => p.name === 'cpu');
    assert.equal(cpu.replica.loaded, false, `nothing loaded it: ${JSON.stringify(cpu.replica)}`);
  });

  it('a device fault that ends a stream with a resumable error counts on the gpu breaker', async (t) => {
    if (breakerChecks.length === 0) return t.skip('no resumable error was produced (no gpu path, or the cases above failed first)');
    // The breaker records a request's outcome before the client sees its
    // final event, so the counts read right after the error include it.
    const wrong = breakerChecks.filter(({ before, after: now }) =>
      !(now.device_faults > before.device_faults && now.ignored === before.ignored));
    assert.deepEqual(wrong.map((w) => w.server), [],
      wrong.map(({ server, id, before, after: now }) =>
        `server ${server}: the device_lost that ended request ${id} with a resumable error must count as a device ` +
        `fault on the gpu breaker (as a migration or a failover does), not be ignored: counts before ` +
        `${JSON.stringify(before)}, after ${JSON.stringify(now)}`).join('\n'));
  });
});
