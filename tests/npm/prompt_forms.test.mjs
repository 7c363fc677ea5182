// Acceptance test of /v1/completions' prompt forms and echo on `spillway
// serve` (the real binary), driven by the official `openai` npm client:
//  - a prompt sent as token ids (the ids `spillway tokenize` gives for a
//    text, BOS included) completes exactly as the text does (greedy), with
//    usage.prompt_tokens the ids' count; ids without the BOS are one token
//    fewer (nothing is added to them);
//  - echo: the text is the prompt followed by the completion, whole and
//    streamed (the prompt's chunk first);
//  - echo with logprobs: the prompt's tokens listed first, the first with a
//    null log-probability and null alternatives, numbers after, text_offset
//    from the start of the echoed text and consistent with the tokens'
//    texts; the streamed entries equal the whole response's;
//  - the 400s: an id past the vocabulary (naming the index and the size), an
//    empty list, a batch of prompts (naming its size);
//  - the journal: a token-id request's record, an echo request's replay by
//    Idempotency-Key (prompt + completion again), and a token-id stream
//    killed (SIGKILL) mid-way that, after a restart on the same journal,
//    resumes from its stored body: received + continuation is the
//    uninterrupted text.
//
// Run by ctest (npm_prompt_forms_test) as `node --test
// tests/npm/prompt_forms.test.mjs` with SPILLWAY_BINARY and
// SPILLWAY_SOURCE_DIR set. Every wait is bounded; servers listen on
// 127.0.0.1 only and are killed in the after hook whatever happens.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BINARY, MODEL, OpenAI, SLOWDOWN, bounded as boundedBy, killServer, slowCpuPath, spawnServer } from './harness.mjs';

const PROMPT = 'Once upon a time, there was a little girl named Lily.';
const TOKEN = 'prompt-forms-test-token';
const bounded = (promise, ms, what) => boundedBy(promise, ms, what, SLOWDOWN);
// The bundled model's EOS, banned so that greedy runs are max_tokens long.
const NO_EOS = { 2: -100 };

const tokenize = (text) => JSON.parse(execFileSync(BINARY, ['tokenize', '-m', MODEL, '--special', text], { encoding: 'utf8' }));
const chars = (s) => [...s].length;

async function startServer(name, journal) {
  const srv = await spawnServer(name, ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
    '--journal', journal, '--checkpoint-every', '1000', '--admin-token', TOKEN, '--health-interval-s', '0']);
  srv.client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOWDOWN });
  return srv;
}

async function consume(stream, what, onChunk = () => {}) {
  const out = { texts: [], text: '', tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [], finish: null, id: null };
  await bounded((async () => {
    for await (const chunk of stream) {
      if (chunk.spillway?.request_id) out.id = chunk.spillway.request_id;
      for (const c of chunk.choices ?? []) {
        if (c.text) out.texts.push(c.text);
        out.text += c.text ?? '';
        if (c.logprobs) {
          for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) out[k].push(...c.logprobs[k]);
        }
        if (c.finish_reason) out.finish = c.finish_reason;
      }
      onChunk(out);
    }
  })(), 60_000, what);
  return out;
}

async function post(base, route, body, headers = {}) {
  const r = await fetch(`${base}${route}`, { method: 'POST', headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body) });
  return { status: r.status, body: await r.json() };
}

describe('prompt forms and echo through the openai client', () => {
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spw-prompt-forms-'));
  const journal = path.join(dir, 'journal.sqlite');
  let S;
  const ids = tokenize(PROMPT);
  const greedy = { model: 'stories260K', max_tokens: 24, temperature: 0, logit_bias: NO_EOS };

  before(async () => { S = await startServer('prompt-forms', journal); });
  after(async () => {
    await killServer(S);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('a token-id prompt completes as its text does, BOS only when sent', async () => {
    assert.ok(ids.length > 5 && ids.every(Number.isInteger), `ids: ${ids}`);
    const byText = await S.client.completions.create({ ...greedy, prompt: PROMPT });
    const byIds = await S.client.completions.create({ ...greedy, prompt: ids });
    const nested = await S.client.completions.create({ ...greedy, prompt: [ids] });
    assert.equal(byIds.choices[0].text, byText.choices[0].text);
    assert.equal(nested.choices[0].text, byText.choices[0].text);
    assert.equal(byText.usage.prompt_tokens, ids.length);
    assert.equal(byIds.usage.prompt_tokens, ids.length);
    assert.equal(byIds.usage.completion_tokens, 24);
    const noBos = await S.client.completions.create({ ...greedy, prompt: ids.slice(1) });
    assert.equal(noBos.usage.prompt_tokens, ids.length - 1, 'no BOS added to token ids');
    // The record keeps the body: the ids are what a resume would run.
    const rec = await (await fetch(`${S.base}/v1/requests/${byIds.spillway.request_id}`)).json();
    assert.equal(rec.state, 'done');
    assert.equal(rec.text, byText.choices[0].text);
    assert.equal(rec.usage.prompt_tokens, ids.length);
  });

  it('echo puts the prompt before the completion, whole and streamed', async () => {
    const plain = await S.client.completions.create({ ...greedy, prompt: PROMPT });
    const echoed = await S.client.completions.create({ ...greedy, prompt: PROMPT, echo: true });
    assert.equal(echoed.choices[0].text, PROMPT + plain.choices[0].text);
    assert.equal(echoed.usage.completion_tokens, plain.usage.completion_tokens);
    const byIds = await S.client.completions.create({ ...greedy, prompt: ids, echo: true });
    assert.equal(byIds.choices[0].text, PROMPT + plain.choices[0].text, 'token ids echo as their decoded text');
    const s = await consume(await S.client.completions.create({ ...greedy, prompt: PROMPT, echo: true, stream: true }), 'echo stream');
    assert.equal(s.texts[0], PROMPT, 'the prompt is the first text chunk');
    assert.equal(s.text, PROMPT + plain.choices[0].text);
  });

  it('echo with logprobs lists the prompt tokens first, the first one null', async () => {
    const plain = await S.client.completions.create({ ...greedy, prompt: PROMPT, logprobs: 2 });
    const r = await S.client.completions.create({ ...greedy, prompt: PROMPT, echo: true, logprobs: 2 });
    const lp = r.choices[0].logprobs;
    const n = ids.length;
    assert.equal(lp.tokens.length, n + 24);
    assert.equal(lp.token_logprobs[0], null);
    assert.equal(lp.top_logprobs[0], null);
    for (let i = 1; i < lp.tokens.length; i++) {
      assert.equal(typeof lp.token_logprobs[i], 'number', `token ${i}`);
      assert.ok(lp.token_logprobs[i] <= 0);
      assert.ok(Object.keys(lp.top_logprobs[i]).length >= 2, `alternatives of ${i}`);
    }
    assert.equal(lp.tokens.join(''), r.choices[0].text, "the tokens' texts are the echoed text");
    assert.equal(lp.text_offset[0], 0);
    for (let i = 1; i < lp.tokens.length; i++) {
      assert.equal(lp.text_offset[i], chars(lp.tokens.slice(0, i).join('')), `text_offset ${i}`);
    }
    // The completion's part is what the request without echo lists.
    assert.deepEqual(lp.token_logprobs.slice(n), plain.choices[0].logprobs.token_logprobs);
    assert.deepEqual(lp.text_offset.slice(n), plain.choices[0].logprobs.text_offset);
    // Token ids give the same entries; streamed, the same lists.
    const byIds = await S.client.completions.create({ ...greedy, prompt: ids, echo: true, logprobs: 2 });
    assert.deepEqual(byIds.choices[0].logprobs, lp);
    const s = await consume(await S.client.completions.create({ ...greedy, prompt: PROMPT, echo: true, logprobs: 2, stream: true }),
      'echo logprobs stream');
    assert.equal(s.texts[0], PROMPT);
    assert.equal(s.text, r.choices[0].text);
    assert.deepEqual(s.tokens, lp.tokens);
    assert.deepEqual(s.token_logprobs, lp.token_logprobs);
    assert.deepEqual(s.top_logprobs, lp.top_logprobs);
    assert.deepEqual(s.text_offset, lp.text_offset);
  });

  it('refuses ids past the vocabulary, empty lists and batches by name', async () => {
    const cases = [
      [{ prompt: [1, 100000] }, /'prompt\[1\]': token id 100000 is past the vocabulary of 512 tokens/],
      [{ prompt: [] }, /must not be empty/],
      [{ prompt: [[]] }, /must not be empty/],
      [{ prompt: [1, -1] }, /negative/],
      [{ prompt: ['a', 'b', 'c'] }, /a batch of 3 prompts: this server takes one prompt per request; send 3 requests/],
      [{ prompt: [[1, 2], [3]] }, /a batch of 2 prompts/],
    ];
    for (const [body, re] of cases) {
      await assert.rejects(S.client.completions.create({ model: 'stories260K', max_tokens: 2, ...body }), (e) => {
        assert.equal(e.status, 400, JSON.stringify(body));
        assert.equal(e.param, 'prompt', JSON.stringify(body));
        assert.match(e.message, re);
        return true;
      });
    }
  });

  it('a replay of an echo request by Idempotency-Key echoes again', async () => {
    const body = { ...greedy, prompt: ids, echo: true };
    const headers = { 'Idempotency-Key': 'echo-replay-1' };
    const first = await post(S.base, '/v1/completions', body, headers);
    assert.equal(first.status, 200, JSON.stringify(first.body));
    const again = await post(S.base, '/v1/completions', body, headers);
    assert.equal(again.status, 200);
    assert.equal(again.body.spillway.replayed, true);
    assert.equal(again.body.choices[0].text, first.body.choices[0].text);
    assert.ok(again.body.choices[0].text.startsWith(PROMPT));
  });

  it('a token-id stream killed mid-way resumes from its stored body after a restart', async () => {
    const body = { model: 'stories260K', prompt: ids, max_tokens: 64, temperature: 0, logit_bias: NO_EOS };
    const reference = (await S.client.completions.create(body)).choices[0].text;
    await slowCpuPath(S.base, TOKEN, 200);
    let killed = null;
    let seen = null;  // the stream's state when it broke off
    const stream = await S.client.completions.create({ ...body, stream: true });
    await consume(stream, 'stream to kill', (out) => {
      seen = out;
      if (!killed && out.texts.length >= 6) killed = killServer(S);
    }).catch(() => {});
    assert.ok(killed, `the server was killed mid-stream (${JSON.stringify(seen)?.slice(0, 300)})`);
    await killed;
    assert.notEqual(seen.finish, 'length', 'test design: the request finished before the kill');
    S = await startServer('prompt-forms-2', journal);
    const id = seen.id;
    assert.ok(id, 'the stream named its request');
    const have = seen.text;
    const rec = await (await fetch(`${S.base}/v1/requests/${id}`)).json();
    assert.equal(rec.state, 'failed', JSON.stringify(rec));
    assert.equal(rec.resumable, true, JSON.stringify(rec));
    assert.ok(reference.startsWith(have), `received text is a prefix of the reference: ${have}`);
    const r = await post(S.base, `/v1/requests/${id}/resume`, { received_text: have });
    assert.equal(r.status, 200, JSON.stringify(r.body));
    assert.equal(have + r.body.choices[0].text, reference);
    assert.equal(r.body.usage.prompt_tokens, ids.length);
    assert.equal(r.body.usage.completion_tokens, 64);
  });
});
