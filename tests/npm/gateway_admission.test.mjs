// Acceptance test of `spillway serve` (the real binary) driven by the official
// `openai` npm client: a GPU path (Vulkan; lavapipe on CI) whose KV pool fits
// short requests but not a long prompt, and a CPU fallback path on the same
// model. Checks admission's decisions (admit on gpu, redirect to cpu by KV and
// by memory pressure from a co-tenant reservation), /v1/quote agreeing with
// them, cancelling a queued CPU request with DELETE /v1/requests/{id}, the
// journal keeping every request readable, and a graceful SIGTERM (exit 0).
//
// Run by ctest (npm_gateway_test) as `node --test tests/npm/gateway_admission.test.mjs`
// with SPILLWAY_BINARY and SPILLWAY_SOURCE_DIR set; the client comes from
// tests/npm/node_modules (scripts/setup runs `npm install` there).
// Every wait is bounded; the server listens on 127.0.0.1 only and is killed in
// the after hook whatever happens.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BINARY, MODEL, OpenAI, SLOWDOWN, SOURCE_DIR, bounded, sleep, slowCpuPath } from './harness.mjs';

// The GPU path's device budget and context: 3.29 MiB leaves 13 KV blocks of
// 16 tokens (208 positions) after the weights and scratch (no token_embd:
// its lookup is the host's) on lavapipe, enough for short requests, not for
// LONG_PROMPT (441 tokens).
// The CPU path gets the model's whole context (2048) so that a long
// generation keeps its single worker busy for seconds (CPU decodes thousands
// of tokens a second on this 260K model, so with ctx 512 a request ends in
// ~50 ms, too soon to queue and cancel another behind it).
// Under a sanitizer the engine is far slower (the 1500-token CPU generation
// below takes ~67 s under TSan against ~3 s in release): its wait scales.
const DEVICE_MEMORY = '3.29MiB';
const CTX = 512;
const CPU_CTX = 2048;
const LONG_PROMPT = Array(40).fill('the little dog ran to the park').join(' ');
const SHORT_PROMPT = 'Once upon a time';
const ADMIN = 'gateway-admission-admin';


describe('spillway serve through the openai client', () => {
  let server;        // the child process
  let exited = null; // a promise of its exit code
  let exitCode;      // set once it exits
  let stderr = '';
  let base;          // http://127.0.0.1:PORT
  let client;
  let gpuBlocks;     // N of "gpu path: N KV blocks of 16 tokens"
  const journal = path.join(os.tmpdir(), `spw-npm-gateway-${process.pid}.sqlite`);
  const seenIds = new Set(); // request ids (numbers) and OpenAI ids (cmpl-...)

  const removeJournal = () => {
    for (const s of ['', '-wal', '-shm', '.lock']) fs.rmSync(journal + s, { force: true });
  };

  // JSON over fetch with a deadline.
  async function call(method, route, body) {
    const r = await fetch(base + route, {
      method,
      headers: body === undefined ? {} : { 'content-type': 'application/json' },
      body: body === undefined ? undefined : JSON.stringify(body),
      signal: AbortSignal.timeout(30_000),
    });
    const text = await r.text();
    let json;
    try { json = JSON.parse(text); } catch { json = undefined; }
    return { status: r.status, json, text, headers: r.headers };
  }

  function remember(spillway, openaiId) {
    if (spillway && spillway.request_id !== undefined) seenIds.add(String(spillway.request_id));
    if (openaiId) seenIds.add(openaiId);
  }

  // A short non-streaming completion; its body and raw response.
  async function shortCompletion() {
    const { data, response } = await bounded(
      client.completions.create({ model: 'stories260K', prompt: SHORT_PROMPT, temperature: 0, max_tokens: 8 }).withResponse(),
      60_000, 'short completion');
    remember(data.spillway, data.id);
    return { data, response };
  }

  before(async () => {
    removeJournal();
    const args = ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--device', 'vulkan',
      '--device-memory', DEVICE_MEMORY, '--ctx', String(CTX), '--parallel', '2',
      '--cpu-parallel', '1', '--cpu-queue', '4', '--cpu-ctx', String(CPU_CTX),
      '--journal', journal, '--threads', '1', '--admin-token', ADMIN,
      // Its co-tenant is declared over the GPU's limit on purpose (the redirect under test).
      '--reservation-max-share', '1'];
    server = spawn(BINARY, args, { stdio: ['ignore', 'pipe', 'pipe'] });
    exited = new Promise((resolve) => server.on('exit', (code, signal) => {
      exitCode = code === null ? `signal ${signal}` : code;
      resolve(exitCode);
    }));
    server.stderr.setEncoding('utf8');
    server.stderr.on('data', (d) => { stderr += d; });
    server.stdout.setEncoding('utf8');
    let stdout = '';
    const port = await bounded(new Promise((resolve, reject) => {
      server.stdout.on('data', (d) => {
        stdout += d;
        const m = stdout.match(/^spillway: listening on http:\/\/127\.0\.0\.1:(\d+) /m);
        if (m) resolve(Number(m[1]));
      });
      exited.then((c) => reject(new Error(`spillway serve exited (${c}) before listening:\n${stdout}\n${stderr}`)));
    }), 60_000, 'the "listening on" line');
    base = `http://127.0.0.1:${port}`;
    // The path lines come before the ready line.
    const m = stderr.match(/gpu path: (\d+) KV blocks of 16 tokens/);
    assert.ok(m, `the gpu path must be built with --device-memory ${DEVICE_MEMORY}; stderr:\n${stderr}`);
    gpuBlocks = Number(m[1]);
    console.log(`gpu path: ${gpuBlocks} KV blocks of 16 tokens (--device-memory ${DEVICE_MEMORY}, --ctx ${CTX})`);
    client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 });
  });

  after(async () => {
    if (server && exitCode === undefined) {
      server.kill('SIGKILL');
      await bounded(exited, 10_000, 'SIGKILL').catch(() => {});
    }
    removeJournal();
  });

  it('the long prompt needs more KV blocks than the gpu pool holds', async () => {
    const q = await call('POST', '/v1/quote', { prompt: LONG_PROMPT, max_tokens: 8 });
    assert.equal(q.status, 200, q.text);
    const tokens = q.json.limits.prompt_tokens;
    assert.ok(tokens > gpuBlocks * 16 && tokens < CTX, `prompt_tokens ${tokens}, gpu pool ${gpuBlocks * 16} tokens, ctx ${CTX}`);
  });

  it('short completions are admitted on the gpu path', async () => {
    const results = await Promise.all([shortCompletion(), shortCompletion()]);
    results.push(await shortCompletion());
    for (const { data, response } of results) {
      assert.equal(data.object, 'text_completion');
      assert.equal(data.choices.length, 1);
      assert.ok(data.choices[0].text.length > 0);
      assert.equal(data.spillway.path, 'gpu', JSON.stringify(data.spillway));
      assert.equal(data.spillway.decision, 'admit', JSON.stringify(data.spillway));
      assert.equal(data.spillway.degraded, false);
      assert.equal(data.spillway.placement, 'vulkan');
      assert.equal(data.spillway.model, 'stories260K');
      assert.equal(response.headers.get('x-spillway-path'), 'gpu');
      assert.equal(response.headers.get('x-spillway-decision'), 'admit');
      assert.equal(response.headers.get('x-spillway-degraded'), 'false');
      assert.equal(response.headers.get('x-spillway-request-id'), String(data.spillway.request_id));
    }
    // temperature 0: the same text each time.
    assert.equal(results[0].data.choices[0].text, results[2].data.choices[0].text);
  });

  it('a long prompt is redirected to the cpu path before acceptance (streamed)', async () => {
    // stories260K has no chat template, so the streamed request is a completion.
    const { data: stream, response } = await bounded(
      client.completions.create({ model: 'stories260K', prompt: LONG_PROMPT, temperature: 0, max_tokens: 16, stream: true }).withResponse(),
      60_000, 'long stream headers');
    assert.equal(response.headers.get('x-spillway-path'), 'cpu');
    assert.equal(response.headers.get('x-spillway-decision'), 'redirect');
    assert.equal(response.headers.get('x-spillway-degraded'), 'true');
    let text = '';
    let spillway;
    let chunks = 0;
    let finish = null;
    await bounded((async () => {
      for await (const chunk of stream) {
        chunks++;
        if (chunk.spillway && !spillway) spillway = chunk.spillway;
        remember(chunk.spillway, chunk.id);
        for (const c of chunk.choices) {
          text += c.text ?? '';
          if (c.finish_reason) finish = c.finish_reason;
        }
      }
    })(), 60_000, 'consuming the long stream');
    assert.ok(spillway, 'some chunk carries a spillway object');
    assert.equal(spillway.path, 'cpu', JSON.stringify(spillway));
    assert.equal(spillway.decision, 'redirect');
    assert.equal(spillway.degraded, true);
    assert.match(spillway.reason, /KV blocks/);
    assert.ok(chunks > 1 && text.length > 0, `chunks ${chunks}, text ${JSON.stringify(text)}`);
    assert.equal(finish, 'length');

    // The quote for the same body agrees with the decision taken.
    const q = await call('POST', '/v1/quote', { prompt: LONG_PROMPT, temperature: 0, max_tokens: 16 });
    assert.equal(q.status, 200, q.text);
    assert.equal(q.json.path, 'cpu');
    assert.equal(q.json.decision, 'redirect');
    const gpu = q.json.paths.find((p) => p.path === 'gpu');
    assert.equal(gpu.can_serve, false);
    assert.match(gpu.reason, /KV blocks/);
    // And for a short body it predicts the gpu admit.
    const qs = await call('POST', '/v1/quote', { prompt: SHORT_PROMPT, temperature: 0, max_tokens: 8 });
    assert.equal(qs.json.path, 'gpu');
    assert.equal(qs.json.decision, 'admit');
  });

  it('a co-tenant reservation over the gpu limit redirects short requests until it is released', async () => {
    const st = await call('GET', '/v1/status');
    assert.equal(st.status, 200, st.text);
    const gpuPath = st.json.paths.find((p) => p.name === 'gpu');
    assert.equal(gpuPath.kv.blocks_total, gpuBlocks);
    const ledger = st.json.ledgers.find((l) => l.name.startsWith('vulkan'));
    assert.ok(ledger, st.text);
    const r = await call('POST', '/v1/reservations', { name: 'whisper', bytes: ledger.limit_bytes + 1_000_000, ttl_s: 30 });
    assert.equal(r.status, 201, r.text);
    assert.equal(r.json.fits, false);
    let released = false;
    try {
      const { data, response } = await shortCompletion();
      assert.equal(data.spillway.path, 'cpu', JSON.stringify(data.spillway));
      assert.equal(data.spillway.decision, 'redirect');
      assert.equal(data.spillway.degraded, true);
      assert.match(data.spillway.reason, /pressure/);
      assert.equal(response.headers.get('x-spillway-path'), 'cpu');
      const d = await call('DELETE', `/v1/reservations/${r.json.id}`);
      assert.equal(d.status, 200, d.text);
      released = true;
    } finally {
      if (!released) await call('DELETE', `/v1/reservations/${r.json.id}`).catch(() => {});
    }
    const { data } = await shortCompletion();
    assert.equal(data.spillway.path, 'gpu', JSON.stringify(data.spillway));
    assert.equal(data.spillway.decision, 'admit');
  });

  it('DELETE /v1/requests/{id} cancels a queued cpu request', async () => {
    // A long generation occupies the cpu path's only worker, slowed 50x (an
    // armed slow fault) until both cancellations are checked, so the requests
    // behind it stay queued however fast the machine; then it ends at full
    // speed.
    const restoreSpeed = await slowCpuPath(base, ADMIN, 50);
    const busy = client.completions.create({ model: 'stories260K', prompt: LONG_PROMPT, temperature: 0, max_tokens: 1500 },
      { timeout: 60_000 * SLOWDOWN });
    busy.catch(() => {}); // awaited below
    const deadline = Date.now() + 20_000;
    for (;;) {
      const st = await call('GET', '/v1/status');
      if (st.json.paths.find((p) => p.name === 'cpu').running >= 1) break;
      assert.ok(Date.now() < deadline, `the cpu path never ran the long request: ${st.text}`);
      await sleep(10);
    }
    // A second cpu request waits in its queue; its stream says so.
    const controller = new AbortController();
    const { data: queued, response } = await bounded(
      client.completions.create({ model: 'stories260K', prompt: LONG_PROMPT, temperature: 0, max_tokens: 8, stream: true },
        { signal: controller.signal }).withResponse(),
      30_000, 'queued stream headers');
    try {
      const headerId = response.headers.get('x-spillway-request-id');
      assert.equal(response.headers.get('x-spillway-path'), 'cpu');
      const it = queued[Symbol.asyncIterator]();
      const first = await bounded(it.next(), 30_000, 'first chunk of the queued stream');
      assert.ok(!first.done);
      const c0 = first.value;
      assert.ok(c0.spillway, JSON.stringify(c0));
      // The opening chunk (no text yet; queued-status chunks have choices: []).
      assert.ok(c0.choices.every((c) => !c.text && c.finish_reason === null), JSON.stringify(c0));
      assert.ok(c0.spillway.queue_position >= 1, JSON.stringify(c0.spillway));
      const id = String(c0.spillway.request_id ?? headerId);
      assert.equal(id, headerId);
      remember(c0.spillway, c0.id);
      const st = await call('GET', '/v1/status');
      assert.ok(st.json.paths.find((p) => p.name === 'cpu').queue_depth >= 1, st.text);

      const t0 = performance.now();
      const del = await call('DELETE', `/v1/requests/${id}`);
      const tDelete = performance.now() - t0;
      assert.equal(del.status, 200, del.text);
      assert.equal(del.json.cancelled, true, del.text);
      // The queued client ends with an error, quickly.
      let error;
      await bounded((async () => {
        try {
          for (;;) {
            const n = await it.next();
            if (n.done) break;
            remember(n.value.spillway, n.value.id);
          }
        } catch (e) {
          error = e;
        }
      })(), 10_000, 'the cancelled stream to end');
      const tEnd = performance.now() - t0;
      assert.ok(error, 'the cancelled stream must end with an error');
      console.log(`cancel: DELETE answered in ${tDelete.toFixed(1)} ms, the queued stream ended in ${tEnd.toFixed(1)} ms ` +
        `(${error.constructor.name}, status ${error.status}: ${error.message}; ${JSON.stringify(error.error)})`);
      // A stream has already answered 200, so the cancellation arrives as an
      // in-stream error event (code "cancelled"), which the client throws.
      assert.equal(error.error?.code, 'cancelled', `${error.constructor.name}: ${error.message}`);
      assert.ok(tEnd < 2000, `the cancelled stream took ${tEnd} ms to end`);
      const g = await call('GET', `/v1/requests/${id}`);
      assert.equal(g.json.state, 'cancelled', g.text);

      // A non-streaming queued request gets the cancellation as HTTP 499. Its
      // id (random, like every request id) is learned the way a client that
      // has no response yet learns it: the same request again under its
      // Idempotency-Key is a 409 naming the request in flight.
      const plainBody = { model: 'stories260K', prompt: LONG_PROMPT, temperature: 0, max_tokens: 8 };
      const plainKey = `plain-${process.pid}`;
      const depth = async () => (await call('GET', '/v1/status')).json.paths.find((p) => p.name === 'cpu').queue_depth;
      const before = await depth();
      const plain = client.completions.create(plainBody, { headers: { 'Idempotency-Key': plainKey } });
      plain.catch(() => {}); // awaited below
      const until = Date.now() + 10_000;
      // Queued first (so that the POSTs below are retries of it, not it).
      while (await depth() <= before) {
        assert.ok(Date.now() < until, 'the non-streaming request never queued');
        await sleep(5);
      }
      let plainId;
      for (;;) {
        const r = await fetch(base + '/v1/completions', {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': plainKey },
          body: JSON.stringify(plainBody),
          signal: AbortSignal.timeout(30_000),
        });
        const text = await r.text();
        if (r.status === 409) {
          plainId = r.headers.get('x-spillway-request-id');
          const g = await call('GET', `/v1/requests/${plainId}`);
          if (g.status === 200 && ['accepted', 'queued'].includes(g.json.state)) break; // accepted until it runs
        }
        assert.ok(Date.now() < until, `the request under ${plainKey} never showed as queued: ${r.status} ${text}`);
        await sleep(5);
      }
      const t1 = performance.now();
      const del2 = await call('DELETE', `/v1/requests/${plainId}`);
      assert.equal(del2.status, 200, del2.text);
      assert.equal(del2.json.cancelled, true, del2.text);
      const perr = await bounded(plain.then(() => null, (e) => e), 10_000, 'the cancelled non-streaming request');
      const tPlain = performance.now() - t1;
      assert.ok(perr, 'the cancelled request must fail');
      console.log(`cancel (non-streaming): ended in ${tPlain.toFixed(1)} ms with status ${perr.status}: ${perr.message}`);
      assert.equal(perr.status, 499, `${perr.constructor.name}: ${perr.message}`);
      assert.ok(tPlain < 2000, `the cancelled request took ${tPlain} ms to end`);
      seenIds.add(plainId);
    } finally {
      controller.abort();
      await restoreSpeed();
    }
    const done = await bounded(busy, 60_000 * SLOWDOWN, 'the long cpu request');
    remember(done.spillway, done.id);
    assert.equal(done.spillway.path, 'cpu');
    assert.equal(done.usage.completion_tokens, 1500);
  });

  it('every request seen stays readable with a terminal state', async () => {
    assert.ok(seenIds.size >= 10, [...seenIds].join(','));
    for (const id of seenIds) {
      const g = await call('GET', `/v1/requests/${id}`);
      assert.equal(g.status, 200, `${id}: ${g.text}`);
      assert.equal(g.json.terminal, true, `${id}: ${g.text}`);
      assert.ok(['done', 'cancelled', 'failed'].includes(g.json.state), `${id}: ${g.text}`);
    }
  });

  it('SIGTERM stops the server with exit code 0', async () => {
    server.kill('SIGTERM');
    const code = await bounded(exited, 30_000, 'exit after SIGTERM');
    assert.equal(code, 0, stderr);
  });
});
