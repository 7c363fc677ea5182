// Issue 31 through the official `openai` npm client: a Q4_K_M model (Q4_K
// weights, Q6_K for the output and half the layers' attn_v / ffn_down,
// generated here by spillway-gen-model with the bundled model's tokenizer)
// served by the real `spillway serve` on Vulkan (lavapipe on CI) and the CPU.
// The K-type matmuls are bitwise the CPU's on the device, so the start-up
// equivalence check passes and a device loss mid-stream migrates the stream
// to the CPU path: the client sees exactly the uninterrupted greedy text, and
// the response says it migrated (spillway.migrations == 1, reason "migrated
// from gpu after device_lost at token N").
//
// One small server (two layers, n_embd 256), 32 tokens: a few seconds. Skips,
// saying why, when the server built no GPU path (no Vulkan device). Run by
// ctest (npm_kquant_migration_test) with SPILLWAY_BINARY, SPILLWAY_GEN_MODEL
// and SPILLWAY_SOURCE_DIR set.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BINARY, MODEL, OpenAI, SLOWDOWN, bounded as boundedBy, call, killServer, sleep, spawnServer } from './harness.mjs';

const GEN_MODEL = process.env.SPILLWAY_GEN_MODEL || path.join(path.dirname(BINARY), 'spillway-gen-model');
const TOKEN = 'kquant-migration-token';
const PROMPT = 'Once upon a time';
const MAX_TOKENS = 32;
// A token costs 3 queue submissions on the GPU path: about token 6.
const LOST_AFTER_SUBMITS = 20;

const bounded = (promise, ms, what) => boundedBy(promise, ms, what, SLOWDOWN);


describe('a Q4_K_M model migrates token-exactly through the openai client', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `spw-npm-kquant-${process.pid}-`));
  const model = path.join(tmp, 'q4_k_m.gguf');
  let srv;
  let modelId;

  before(async () => {
    const gen = spawnSync(GEN_MODEL, ['--out', model, '--embd', '256', '--layers', '2', '--heads', '4',
      '--kv-heads', '2', '--ffn', '512', '--ctx', '2048', '--mix', 'q4_k_m', '--vocab', MODEL],
    { encoding: 'utf8', timeout: 60_000 });
    assert.equal(gen.status, 0, `${GEN_MODEL} failed (${gen.error ?? ''}):\n${gen.stdout}\n${gen.stderr}`);
    srv = await spawnServer('K', ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
      '--device', 'vulkan', '--checkpoint-every', '4', '--admin-token', TOKEN, '--breaker-consecutive-failures', '1',
      '--breaker-cooldown-s', '1', '--breaker-max-cooldown-s', '1', '--health-interval-s', '0',
      '--journal', path.join(tmp, 'k.sqlite')]);
    srv.gpu = /paths=gpu:vulkan/.test(srv.ready);
    srv.client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOWDOWN });
    console.log(srv.ready);
    modelId = (await call(srv, 'GET', '/v1/models')).json.data[0].id;
  });

  after(async () => {
    await killServer(srv);
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('passes the equivalence check and a device loss mid-stream continues on the cpu path, text exact', async (t) => {
    if (!srv.gpu) return t.skip(`no gpu path (no Vulkan device): ${srv.ready}`);
    assert.match(srv.stderr, /equivalence gpu <-> cpu: passed/, `the Q4_K_M model must pass its equivalence check:\n${srv.stderr}`);
    const ref = await bounded(
      srv.client.completions.create({ model: modelId, prompt: PROMPT, temperature: 0, max_tokens: MAX_TOKENS }),
      60_000, 'the reference run');
    assert.equal(ref.spillway.path, 'gpu', JSON.stringify(ref.spillway));
    assert.equal(ref.usage.completion_tokens, MAX_TOKENS, 'the reference must run to max_tokens');
    const reference = ref.choices[0].text;

    const armed = await call(srv, 'POST', '/v1/admin/faults',
      { path: 'gpu', kind: 'device_lost', after_submits: LOST_AFTER_SUBMITS, count: 1 },
      { authorization: `Bearer ${TOKEN}` });
    assert.equal(armed.status, 201, armed.text);
    const stream = await bounded(
      srv.client.completions.create({ model: modelId, prompt: PROMPT, temperature: 0, max_tokens: MAX_TOKENS, stream: true }),
      60_000, 'stream headers');
    let text = '';
    const spillways = [];
    let finish = null;
    await bounded((async () => {
      for await (const chunk of stream) {
        if (chunk.spillway) spillways.push(chunk.spillway);
        for (const c of chunk.choices ?? []) {
          if (c.text) text += c.text;
          if (c.finish_reason) finish = c.finish_reason;
        }
      }
    })(), 60_000, 'consuming the stream');
    assert.equal(text, reference, 'the migrated stream must be the uninterrupted greedy text, exactly');
    assert.equal(finish, 'length');
    const first = spillways[0];
    const last = spillways.at(-1);
    assert.equal(first.path, 'gpu', JSON.stringify(first));
    assert.equal(last.path, 'cpu', JSON.stringify(last));
    assert.equal(last.migrations, 1, JSON.stringify(last));
    const m = last.reason.match(/^migrated from gpu after device_lost at token (\d+)/);
    assert.ok(m, `reason: ${last.reason}`);
    assert.ok(Number(m[1]) > 0 && Number(m[1]) < MAX_TOKENS, `the fault hit mid-stream: ${last.reason}`);
    await sleep(0);
  });
});
