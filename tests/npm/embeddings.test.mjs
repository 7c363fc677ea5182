// POST /v1/embeddings through the official `openai` npm client
// (embeddings.create, which asks for base64 unless told otherwise and decodes
// it): an embedding model generated here by spillway-gen-model (mean
// pooling, the bundled model's tokenizer) served as a catalogue model beside
// the bundled one, on the Vulkan device (lavapipe on CI) and, in a second
// server, on the CPU. Checks: one vector per input, unit length, base64 and
// float forms equal, the GPU's and the CPU's vectors within cosine 0.9999,
// usage counted, a model without pooling refused by name, dimensions other
// than the model's width refused. Run by ctest (npm_embeddings_test) with
// SPILLWAY_BINARY, SPILLWAY_GEN_MODEL and SPILLWAY_SOURCE_DIR set; every wait
// is bounded and the servers are killed in the after hook.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BINARY, MODEL, OpenAI, SLOWDOWN, bounded as boundedBy, killServer, spawnServer } from './harness.mjs';

const GEN_MODEL = process.env.SPILLWAY_GEN_MODEL || path.join(path.dirname(BINARY), 'spillway-gen-model');
const INPUTS = ['Once upon a time there was a dog', 'The little cat sat on the mat', 'Lily went to the park'];
const bounded = (promise, ms, what) => boundedBy(promise, ms, what, SLOWDOWN);

const cosine = (a, b) => {
  let ab = 0; let aa = 0; let bb = 0;
  for (let i = 0; i < a.length; i++) { ab += a[i] * b[i]; aa += a[i] * a[i]; bb += b[i] * b[i]; }
  return ab / Math.sqrt(aa * bb);
};

describe('/v1/embeddings through the openai client', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `spw-npm-embeddings-${process.pid}-`));
  const model = path.join(tmp, 'embed.gguf');
  const servers = {};
  const clients = {};

  before(async () => {
    const gen = spawnSync(GEN_MODEL, ['--out', model, '--embd', '128', '--layers', '2', '--heads', '4',
      '--kv-heads', '4', '--ffn', '256', '--ctx', '256', '--type', 'f16', '--pooling', 'mean', '--vocab', MODEL],
    { encoding: 'utf8', timeout: 60_000 });
    assert.equal(gen.status, 0, `${GEN_MODEL} failed (${gen.error ?? ''}):\n${gen.stdout}\n${gen.stderr}`);
    for (const device of ['vulkan', 'cpu']) {
      servers[device] = await spawnServer(device, ['serve', '--model', MODEL, '--model', `embed=${model}`,
        '--host', '127.0.0.1', '--port', '0', '--threads', '1', '--device', device, '--journal', 'none',
        '--health-interval-s', '0']);
      clients[device] = new OpenAI({ baseURL: `${servers[device].base}/v1`, apiKey: 'unused', maxRetries: 0,
        timeout: 60_000 * SLOWDOWN });
    }
  });

  after(async () => {
    for (const s of Object.values(servers)) await killServer(s);
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('gives one unit vector per input, the same in base64 and float, on the GPU as on the CPU', async (t) => {
    const gpu = /paths=gpu:vulkan/.test(servers.vulkan.ready);
    const got = {};
    for (const device of ['vulkan', 'cpu']) {
      const r = await bounded(clients[device].embeddings.create({ model: 'embed', input: INPUTS }), 60_000,
        `embeddings on ${device}`);
      assert.equal(r.object, 'list');
      assert.equal(r.model, 'embed');
      assert.equal(r.data.length, INPUTS.length);
      r.data.forEach((d, i) => {
        assert.equal(d.index, i);
        assert.equal(d.embedding.length, 128);
        const norm = Math.sqrt(d.embedding.reduce((s, v) => s + v * v, 0));
        assert.ok(Math.abs(norm - 1) < 1e-5, `unit length, got ${norm}`);
      });
      assert.ok(r.usage.prompt_tokens >= INPUTS.length && r.usage.total_tokens === r.usage.prompt_tokens);
      if (device === 'vulkan' && gpu) assert.equal(r.spillway.path, 'gpu/embed');
      if (device === 'cpu') assert.equal(r.spillway.path, 'cpu/embed');
      const f = await bounded(clients[device].embeddings.create({ model: 'embed', input: INPUTS,
        encoding_format: 'float' }), 60_000, `float embeddings on ${device}`);
      r.data.forEach((d, i) => assert.deepEqual(Array.from(d.embedding), f.data[i].embedding));
      got[device] = f.data.map((d) => d.embedding);
    }
    if (!gpu) return t.skip(`no gpu path (no Vulkan device): ${servers.vulkan.ready}`);
    INPUTS.forEach((_, i) => {
      const c = cosine(got.vulkan[i], got.cpu[i]);
      assert.ok(c >= 0.9999, `input ${i}: cosine ${c} between the GPU's and the CPU's vectors`);
    });
    // Different texts, different vectors.
    assert.ok(cosine(got.cpu[0], got.cpu[1]) < 0.9999);
  });

  it('refuses a model without pooling and a width it does not have', async () => {
    await assert.rejects(clients.cpu.embeddings.create({ input: 'hello' }),
      (e) => e.status === 400 && e.param === 'model' && /declares no pooling type/.test(e.message));
    await assert.rejects(clients.cpu.embeddings.create({ model: 'embed', input: 'hello', dimensions: 64 }),
      (e) => e.status === 400 && e.param === 'dimensions');
    await assert.rejects(clients.cpu.embeddings.create({ model: 'embed', input: '' }),
      (e) => e.status === 400 && e.param === 'input');
  });
});
