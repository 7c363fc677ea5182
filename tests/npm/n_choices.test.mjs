// OpenAI's n > 1 on `spillway serve` (the real binary, the bundled
// stories260K model, the CPU path) through the official `openai` npm client,
// on /v1/completions and /v1/chat/completions:
//  - n: 3 greedy: three choices, index 0..2, identical, each the n = 1 text;
//  - n: 3 seeded: reproducible, and choice i is the n = 1 request with seed
//    s + i (the documented rule), usage.completion_tokens the choices' sum;
//  - streaming n: 2: chunks carry their choice's index, each choice ends
//    with its own finish_reason chunk, the usage chunk comes once, and the
//    streamed texts reassemble to the non-streamed ones;
//  - the journal keeps every choice: GET /v1/requests/{id} lists them by
//    index, and a replay by Idempotency-Key answers with all of them;
//  - n out of range, best_of != n and n with echo are 400s naming the field.
// Run by ctest (npm_n_choices_test) as `node --test tests/npm/n_choices.test.mjs`
// with SPILLWAY_BINARY and SPILLWAY_SOURCE_DIR set. Every wait is bounded;
// the server listens on 127.0.0.1 only and is killed in the after hook.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { OpenAI, MODEL, SLOWDOWN, bounded as boundedBy, killServer, spawnServer } from './harness.mjs';

const bounded = (promise, what) => boundedBy(promise, 60_000, what, SLOWDOWN);
const PROMPT = 'Once upon a time';
const MESSAGES = [{ role: 'user', content: 'Tell me a story about Lily.' }];

describe('n > 1 through the openai client', () => {
  let srv;
  let client;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spw-npm-n-'));
  before(async () => {
    srv = await spawnServer('n-choices', ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0',
      '--threads', '1', '--chat-template', 'chatml', '--journal', path.join(dir, 'journal.sqlite')]);
    client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOWDOWN });
  });
  after(async () => {
    await killServer(srv);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  const complete = (extra, what) => bounded(client.completions.create(
    { model: 'stories260K', prompt: PROMPT, max_tokens: 24, ...extra }), what);
  const chat = (extra, what) => bounded(client.chat.completions.create(
    { model: 'stories260K', messages: MESSAGES, max_tokens: 24, ...extra }), what);
  const texts = (r) => r.choices.map((c) => c.text ?? c.message.content);

  const checkIndexes = (r, n) => {
    assert.equal(r.choices.length, n);
    r.choices.forEach((c, i) => assert.equal(c.index, i));
  };

  it('n: 3 greedy gives three identical choices, each the n = 1 text', async () => {
    for (const [call, what] of [[complete, 'completions'], [chat, 'chat']]) {
      const one = await call({ temperature: 0 }, `${what} n=1`);
      const three = await call({ temperature: 0, n: 3 }, `${what} n=3`);
      checkIndexes(three, 3);
      assert.deepEqual(texts(three), Array(3).fill(texts(one)[0]), what);
      for (const c of three.choices) assert.equal(c.finish_reason, one.choices[0].finish_reason);
      assert.equal(three.usage.completion_tokens, 3 * one.usage.completion_tokens, what);
      assert.equal(three.usage.prompt_tokens, one.usage.prompt_tokens, what);
    }
  });

  it('n: 3 seeded is reproducible and choice i is the n = 1 request with seed s + i', async () => {
    const seed = 4242;
    for (const [call, what] of [[complete, 'completions'], [chat, 'chat']]) {
      const sampling = { temperature: 1, top_p: 1, seed };
      const a = await call({ ...sampling, n: 3 }, `${what} n=3`);
      const b = await call({ ...sampling, n: 3 }, `${what} n=3 again`);
      checkIndexes(a, 3);
      assert.deepEqual(texts(b), texts(a), `${what}: not reproducible`);
      assert.ok(new Set(texts(a)).size > 1, `${what}: three seeds, one text: ${JSON.stringify(texts(a))}`);
      let sum = 0;
      for (let i = 0; i < 3; ++i) {
        const lone = await call({ ...sampling, seed: seed + i }, `${what} seed ${seed + i}`);
        assert.equal(texts(lone)[0], texts(a)[i], `${what}: choice ${i} vs seed ${seed + i}`);
        assert.equal(lone.choices[0].finish_reason, a.choices[i].finish_reason);
        sum += lone.usage.completion_tokens;
      }
      assert.equal(a.usage.completion_tokens, sum, what);
      // The seed the response reports is the base (choice 0's).
      assert.equal(a.spillway.seed, seed);
    }
  });

  it('streaming n: 2 carries each choice by index and reassembles to the same texts', async () => {
    for (const [endpoint, what] of [[client.completions, 'completions'], [client.chat.completions, 'chat']]) {
      const body = what === 'chat' ? { messages: MESSAGES } : { prompt: PROMPT };
      const sampling = { model: 'stories260K', max_tokens: 24, temperature: 1, seed: 99, n: 2, ...body };
      const whole = await bounded(endpoint.create(sampling), `${what} whole`);
      const stream = await bounded(endpoint.create({ ...sampling, stream: true, stream_options: { include_usage: true } }),
        `${what} stream`);
      const got = ['', ''];
      const finishes = [null, null];
      let usage = null;
      let usageChunks = 0;
      for await (const chunk of stream) {
        if (chunk.usage) { usage = chunk.usage; ++usageChunks; }
        for (const c of chunk.choices) {
          assert.ok(c.index === 0 || c.index === 1, `index ${c.index}`);
          got[c.index] += (what === 'chat' ? c.delta?.content : c.text) ?? '';
          if (c.finish_reason) {
            assert.equal(finishes[c.index], null, `two finish_reason chunks for choice ${c.index}`);
            finishes[c.index] = c.finish_reason;
          }
        }
      }
      assert.deepEqual(got, texts(whole), what);
      assert.deepEqual(finishes, whole.choices.map((c) => c.finish_reason), what);
      assert.equal(usageChunks, 1, what);
      assert.equal(usage.completion_tokens, whole.usage.completion_tokens, what);
    }
  });

  it('the journal keeps every choice: the record and an idempotent replay', async () => {
    for (const [endpoint, what] of [[client.completions, 'completions'], [client.chat.completions, 'chat']]) {
      const body = { model: 'stories260K', max_tokens: 24, temperature: 1, seed: 11, n: 3,
        ...(what === 'chat' ? { messages: MESSAGES } : { prompt: PROMPT }) };
      const headers = { 'Idempotency-Key': `n3-${what}` };
      const first = await bounded(endpoint.create(body, { headers }), `${what} first`);
      checkIndexes(first, 3);
      const rec = await (await fetch(`${srv.base}/v1/requests/${first.spillway.request_id}`,
        { signal: AbortSignal.timeout(10_000) })).json();
      assert.deepEqual(rec.choices.map((c) => c.index), [0, 1, 2], what);
      assert.deepEqual(rec.choices.map((c) => c.text), texts(first), what);
      assert.deepEqual(rec.choices.map((c) => c.finish_reason), first.choices.map((c) => c.finish_reason), what);
      assert.equal(rec.text, texts(first)[0]);
      const again = await bounded(endpoint.create(body, { headers }), `${what} replay`);
      assert.equal(again.spillway.replayed, true, what);
      checkIndexes(again, 3);
      assert.deepEqual(texts(again), texts(first), what);
      assert.deepEqual(again.choices.map((c) => c.finish_reason), first.choices.map((c) => c.finish_reason), what);
      assert.equal(again.usage.completion_tokens, first.usage.completion_tokens, what);
      // A streamed request's replay streams the same choices by index.
      const sheaders = { 'Idempotency-Key': `n3-${what}-stream` };
      const streamed = async () => {
        const stream = await bounded(endpoint.create({ ...body, stream: true }, { headers: sheaders }), `${what} stream`);
        const got = ['', '', ''];
        for await (const chunk of stream) {
          for (const c of chunk.choices) got[c.index] += (what === 'chat' ? c.delta?.content : c.text) ?? '';
        }
        return got;
      };
      assert.deepEqual(await streamed(), texts(first), `${what} stream`);
      assert.deepEqual(await streamed(), texts(first), `${what} stream replay`);
    }
  });

  it('n out of range, best_of other than n and n with echo are 400s naming the field', async () => {
    const cases = [
      [{ n: 0 }, 'n'], [{ n: 17 }, 'n'], [{ n: 2, best_of: 3 }, 'best_of'], [{ n: 2, best_of: 1 }, 'best_of'],
      [{ n: 2, echo: true }, 'echo'],
    ];
    for (const [extra, param] of cases) {
      await assert.rejects(complete(extra, JSON.stringify(extra)), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${JSON.stringify(extra)}: ${e.constructor.name}: ${e.message}`);
        assert.equal(e.param, param, e.message);
        return true;
      });
    }
    const ok = await complete({ temperature: 0, n: 2, best_of: 2 }, 'best_of = n');
    checkIndexes(ok, 2);
  });
});
