// Acceptance test of OpenAI's response_format by constrained decoding, on
// `spillway serve` (the real binary, the bundled stories260K model) driven by
// the official `openai` npm client:
//  - json_object: completions and chat answers parse as JSON objects;
//  - json_schema: 1,000 seeded samples (seeds 1..1000, temperature 1) of a
//    bounded schema all parse and validate against it (a small validator of
//    the supported subset below), each ended by the model ("stop");
//  - a streamed constrained request gives the text of the non-streamed one
//    with the same seed;
//  - a schema keyword outside the subset is a 400 naming it and its JSON
//    pointer (param response_format);
//  - on a server with a GPU path (Vulkan; lavapipe on CI): a device loss
//    mid-stream migrates a constrained stream to the CPU path, and with
//    X-Spillway-Migrate: never the resumable error's resume completes it; both
//    texts are the uninterrupted one and validate (skipped, saying so, without
//    a Vulkan device).
// Run by ctest (npm_response_format_test) as `node --test
// tests/npm/response_format.test.mjs` with SPILLWAY_BINARY and
// SPILLWAY_SOURCE_DIR set. Every wait is bounded; servers listen on
// 127.0.0.1 only and are killed in the after hook whatever happens. Under a
// sanitizer (SLOWDOWN > 1) the 1,000 samples are 1000 / (4 x SLOWDOWN).
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { MODEL, OpenAI, SLOWDOWN, bounded as boundedBy, killServer, sleep, spawnServer } from './harness.mjs';

const bounded = (promise, ms, what) => boundedBy(promise, ms, what, SLOWDOWN);
const PROMPT = 'Once upon a time';
const TOKEN = 'response-format-token';

// Bounded: every document fits MAX_TOKENS (each token adds at least one
// byte; between two JSON tokens at most a line break and 12 spaces), so each answer
// ends with the model's end-of-text, never with the length limit.
const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', minLength: 1, maxLength: 4 },
    age: { type: 'integer' },
    ok: { type: 'boolean' },
    color: { enum: ['red', 'green', 'blue'] },
    extra: { anyOf: [{ type: 'null' }, { type: 'integer' }] },
  },
  required: ['name', 'age', 'ok', 'color'],
  additionalProperties: false,
};
const MAX_TOKENS = 480;
const SAMPLES = SLOWDOWN > 1 ? Math.ceil(1000 / (4 * SLOWDOWN)) : 1000;
const jsonSchema = (schema = SCHEMA) => ({ type: 'json_schema', json_schema: { name: 'person', strict: true, schema } });

// A validator of the subset the server supports (docs/OPENAI_COMPAT.md):
// the errors found, [] when `v` is valid.
function validate(schema, v, root = schema, at = '') {
  if (schema === true) return [];
  if (schema === false) return [`${at}: false schema`];
  if (schema.$ref) {
    const m = schema.$ref.match(/^#(?:\/(\$defs|definitions)\/(.+))?$/);
    return validate(m && m[1] ? root[m[1]][m[2]] : root, v, root, at);
  }
  const union = schema.anyOf ?? schema.oneOf;
  if (union) return union.some((s) => validate(s, v, root, at).length === 0) ? [] : [`${at}: no branch matches`];
  const errs = [];
  const typeOf = (x) => (x === null ? 'null' : Array.isArray(x) ? 'array' : typeof x);
  if (schema.type) {
    const types = [].concat(schema.type);
    const t = typeOf(v);
    const ok = types.some((ty) => ty === t || (ty === 'integer' && Number.isInteger(v)));
    if (!ok) return [`${at}: ${JSON.stringify(v)} is not ${types}`];
  }
  if (schema.enum && !schema.enum.some((e) => JSON.stringify(e) === JSON.stringify(v))) errs.push(`${at}: not in enum`);
  if ('const' in schema && JSON.stringify(schema.const) !== JSON.stringify(v)) errs.push(`${at}: not the const`);
  if (typeof v === 'string') {
    const n = [...v].length;
    if (schema.minLength !== undefined && n < schema.minLength) errs.push(`${at}: shorter than ${schema.minLength}`);
    if (schema.maxLength !== undefined && n > schema.maxLength) errs.push(`${at}: longer than ${schema.maxLength}`);
  }
  if (Array.isArray(v)) {
    if (schema.minItems !== undefined && v.length < schema.minItems) errs.push(`${at}: fewer items`);
    if (schema.maxItems !== undefined && v.length > schema.maxItems) errs.push(`${at}: more items`);
    if (schema.items !== undefined) v.forEach((x, i) => errs.push(...validate(schema.items, x, root, `${at}/${i}`)));
  }
  if (typeOf(v) === 'object') {
    for (const r of schema.required ?? []) if (!(r in v)) errs.push(`${at}: ${r} missing`);
    for (const [k, x] of Object.entries(v)) {
      const sub = schema.properties?.[k] ?? schema.additionalProperties ?? true;
      errs.push(...validate(sub, x, root, `${at}/${k}`));
    }
  }
  return errs;
}

function assertValid(text, schema = SCHEMA, what = '') {
  let v;
  assert.doesNotThrow(() => { v = JSON.parse(text); }, `${what}: not JSON: ${JSON.stringify(text)}`);
  assert.deepEqual(validate(schema, v), [], `${what}: ${JSON.stringify(text)}`);
  return v;
}

// Runs fn(i) for i in [0, n) with at most `width` in flight.
async function pool(n, width, fn) {
  let next = 0;
  await Promise.all(Array.from({ length: width }, async () => {
    while (next < n) await fn(next++);
  }));
}

async function streamText(stream, what) {
  let text = '';
  let finish = null;
  const spillways = [];
  let error = null;
  await bounded((async () => {
    try {
      for await (const chunk of stream) {
        if (chunk.spillway) spillways.push(chunk.spillway);
        for (const c of chunk.choices ?? []) {
          text += c.text ?? c.delta?.content ?? '';
          if (c.finish_reason) finish = c.finish_reason;
        }
      }
    } catch (e) {
      error = e;
    }
  })(), 60_000, what);
  return { text, finish, spillways, error };
}

describe('response_format through the openai client', () => {
  let srv;
  let client;
  const t0 = performance.now();
  before(async () => {
    srv = await spawnServer('response-format', ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0',
      '--threads', '2', '--parallel', '4', '--queue', '64', '--chat-template', 'chatml']);
    client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOWDOWN });
  });
  after(async () => {
    await killServer(srv);
    console.log(`response_format test (cpu server): ${((performance.now() - t0) / 1000).toFixed(1)} s`);
  });

  it('json_object: completions and chat answers parse as JSON objects', async () => {
    for (const seed of [1, 2, 3]) {
      const r = await bounded(client.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: 200,
        temperature: 1, seed, response_format: { type: 'json_object' } }), 60_000, 'json_object completion');
      if (r.choices[0].finish_reason === 'stop') {
        const v = JSON.parse(r.choices[0].text);
        assert.equal(typeof v, 'object');
        assert.ok(v !== null && !Array.isArray(v), r.choices[0].text);
      } else {
        // Cut by max_tokens (json_object is unbounded): still an object's prefix.
        assert.match(r.choices[0].text, /^\s*\{/);
      }
    }
    const c = await bounded(client.chat.completions.create({ model: 'stories260K', max_tokens: 200, temperature: 0,
      messages: [{ role: 'user', content: 'Give me JSON' }], response_format: { type: 'json_object' } }), 60_000, 'chat');
    const text = c.choices[0].message.content;
    assert.match(text, /^\s*\{/, text);
    if (c.choices[0].finish_reason === 'stop') assert.equal(typeof JSON.parse(text), 'object');
  });

  it(`json_schema: ${SAMPLES} seeded samples all parse and validate`, async () => {
    const t = performance.now();
    let tokens = 0;
    const texts = new Set();
    await pool(SAMPLES, 8, async (i) => {
      const seed = i + 1;
      const r = await bounded(client.completions.create({ model: 'stories260K', prompt: PROMPT, max_tokens: MAX_TOKENS,
        temperature: 1, seed, response_format: jsonSchema() }), 60_000, `seed ${seed}`);
      const choice = r.choices[0];
      assert.equal(choice.finish_reason, 'stop', `seed ${seed} ended by ${choice.finish_reason}: ${choice.text}`);
      assertValid(choice.text, SCHEMA, `seed ${seed}`);
      tokens += r.usage.completion_tokens;
      texts.add(choice.text);
    });
    const s = (performance.now() - t) / 1000;
    console.log(`${SAMPLES} constrained samples: ${s.toFixed(1)} s, ${tokens} tokens (${(tokens / s).toFixed(0)}/s), ` +
      `${texts.size} distinct`);
    assert.ok(texts.size > SAMPLES / 2, `sampling still samples: ${texts.size} distinct of ${SAMPLES}`);
  });

  it('a streamed constrained request gives the non-streamed text for the same seed (both endpoints)', async () => {
    for (const seed of [11, 12]) {
      const body = { model: 'stories260K', prompt: PROMPT, max_tokens: MAX_TOKENS, temperature: 1, seed,
        response_format: jsonSchema() };
      const whole = await bounded(client.completions.create(body), 60_000, 'whole');
      const streamed = await streamText(await client.completions.create({ ...body, stream: true }), 'stream');
      assert.equal(streamed.error, null);
      assert.equal(streamed.text, whole.choices[0].text);
      assert.equal(streamed.finish, 'stop');
      assertValid(streamed.text);
    }
    const chat = { model: 'stories260K', messages: [{ role: 'user', content: 'A person' }], max_tokens: MAX_TOKENS,
      temperature: 1, seed: 5, response_format: jsonSchema() };
    const whole = await bounded(client.chat.completions.create(chat), 60_000, 'chat whole');
    const streamed = await streamText(await client.chat.completions.create({ ...chat, stream: true }), 'chat stream');
    assert.equal(streamed.text, whole.choices[0].message.content);
    assertValid(streamed.text);
  });

  it('a keyword outside the subset is a 400 naming it and its JSON pointer', async () => {
    const schema = { type: 'object', properties: { when: { type: 'string', format: 'date-time' } } };
    for (const call of [
      () => client.completions.create({ model: 'stories260K', prompt: PROMPT, response_format: jsonSchema(schema) }),
      () => client.chat.completions.create({ model: 'stories260K', messages: [{ role: 'user', content: 'x' }],
        response_format: jsonSchema(schema) }),
    ]) {
      const err = await bounded(call().then(() => null, (e) => e), 30_000, 'refusal');
      assert.ok(err instanceof OpenAI.BadRequestError, String(err));
      assert.equal(err.error.param, 'response_format');
      assert.match(err.error.message, /unsupported keyword 'format' at \/properties\/when/);
    }
  });
});

describe('a constrained stream migrates and resumes (Vulkan)', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `spw-npm-rf-${process.pid}-`));
  let srv;
  let client;
  let gpu = false;
  const admin = { authorization: `Bearer ${TOKEN}`, 'content-type': 'application/json' };
  const call = async (method, route, body, headers = {}) => {
    const r = await fetch(srv.base + route, { method, headers: { 'content-type': 'application/json', ...headers },
      body: body === undefined ? undefined : JSON.stringify(body), signal: AbortSignal.timeout(60_000 * SLOWDOWN) });
    const text = await r.text();
    return { status: r.status, text, json: (() => { try { return JSON.parse(text); } catch { return undefined; } })() };
  };
  const inService = async () => {
    const deadline = Date.now() + 60_000 * SLOWDOWN;
    for (;;) {
      const g = (await call('GET', '/v1/status')).json.paths.find((p) => p.name === 'gpu');
      if (g.breaker?.state === 'closed' && g.device?.healthy === true) return;
      assert.ok(Date.now() < deadline, `the gpu path did not come back: ${JSON.stringify(g)}`);
      await sleep(50);
    }
  };
  const body = { model: 'stories260K', prompt: PROMPT, max_tokens: MAX_TOKENS, temperature: 1, seed: 3,
    response_format: jsonSchema() };

  before(async () => {
    srv = await spawnServer('response-format-vulkan', ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0',
      '--threads', '1', '--device', 'vulkan', '--checkpoint-every', '4', '--admin-token', TOKEN,
      '--breaker-consecutive-failures', '1', '--breaker-cooldown-s', '1', '--breaker-max-cooldown-s', '1',
      '--health-interval-s', '0', '--journal', path.join(tmp, 'j.sqlite')]);
    gpu = /paths=gpu:vulkan/.test(srv.ready);
    client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOWDOWN });
  });
  after(async () => {
    await killServer(srv);
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('a device loss mid-stream moves it to the cpu path; the text is the uninterrupted one and validates', async (t) => {
    if (!gpu) return t.skip(`no gpu path (no Vulkan device): ${srv.ready}`);
    await inService();
    const reference = await bounded(client.completions.create(body), 60_000, 'reference');
    assert.equal(reference.spillway.path, 'gpu');
    const ref = reference.choices[0].text;
    assertValid(ref);
    const armed = await call('POST', '/v1/admin/faults', { path: 'gpu', kind: 'device_lost', after_submits: 20, count: 1 }, admin);
    assert.equal(armed.status, 201, armed.text);
    const out = await streamText(await client.completions.create({ ...body, stream: true }), 'migrating stream');
    assert.equal(out.error, null, String(out.error));
    assert.equal(out.spillways.at(-1).path, 'cpu', JSON.stringify(out.spillways.at(-1)));
    assert.equal(out.spillways.at(-1).migrations, 1);
    assert.equal(out.text, ref);
    assertValid(out.text, SCHEMA, 'migrated');
  });

  it('X-Spillway-Migrate: never, then resume: the continuation completes the same document', async (t) => {
    if (!gpu) return t.skip(`no gpu path (no Vulkan device): ${srv.ready}`);
    await inService();
    const ref = (await bounded(client.completions.create(body), 60_000, 'reference')).choices[0].text;
    const armed = await call('POST', '/v1/admin/faults', { path: 'gpu', kind: 'device_lost', after_submits: 20, count: 1 }, admin);
    assert.equal(armed.status, 201, armed.text);
    const out = await streamText(await client.completions.create({ ...body, stream: true },
      { headers: { 'X-Spillway-Migrate': 'never' } }), 'interrupted stream');
    assert.ok(out.error, 'the stream must end with a resumable error');
    assert.equal(out.error.error?.code, 'resumable', JSON.stringify(out.error.error));
    assert.ok(ref.startsWith(out.text) && out.text.length < ref.length, JSON.stringify(out.text));
    const resumed = await call('POST', out.error.error.resume_url, { received_text: out.text });
    assert.equal(resumed.status, 200, resumed.text);
    assert.equal(out.text + resumed.json.choices[0].text, ref);
    assertValid(out.text + resumed.json.choices[0].text, SCHEMA, 'resumed');
  });
});
