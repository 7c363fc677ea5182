// Acceptance test of OpenAI's `logprobs` on `spillway serve` (the real binary)
// driven by the official `openai` npm client: /v1/completions' legacy shape
// (tokens, token_logprobs, top_logprobs, text_offset), /v1/chat/completions'
// content entries (token, logprob, bytes, top_logprobs), whole and streamed;
// the entries line up with the text (each token once, never ahead of its
// text; a token completing a stop string not listed); two batched streams
// report what each would alone; the 400s for bad values (top_logprobs
// without logprobs, ranges, a seed past 2^53 - 1); a replay by
// Idempotency-Key answers "logprobs": null; and, when the machine has a
// Vulkan device, a stream that migrates mid-way to the cpu path goes on
// listing entries with none repeated or skipped.
//
// Run by ctest (npm_logprobs_test) as `node --test tests/npm/logprobs.test.mjs`
// with SPILLWAY_BINARY and SPILLWAY_SOURCE_DIR set; the client comes from
// tests/npm/node_modules (scripts/setup runs `npm install` there).
// Every wait is bounded; the servers listen on 127.0.0.1 only and are killed
// in the after hook whatever happens.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { MODEL, OpenAI, SLOWDOWN, bounded as boundedBy, killServer, spawnServer } from './harness.mjs';

const PROMPT = 'Once upon a time';
const MESSAGES = [{ role: 'user', content: 'Tell me a story about a little dog.' }];
const TOKEN = 'logprobs-test-token';
const bounded = (promise, ms, what) => boundedBy(promise, ms, what, SLOWDOWN);

async function startServer(name, args) {
  const srv = await spawnServer(name, ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
    '--chat-template', 'chatml', ...args]);
  srv.gpu = /paths=gpu:vulkan/.test(srv.ready);
  srv.client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOWDOWN });
  return srv;
}

// The probabilities of a list of alternatives: most likely first, and
// together no more than the whole distribution.
function assertDistribution(logprobs, what) {
  for (let i = 1; i < logprobs.length; i++) {
    assert.ok(logprobs[i - 1] >= logprobs[i], `${what}: sorted descending: ${logprobs}`);
  }
  for (const lp of logprobs) assert.ok(lp <= 0, `${what}: a log-probability is <= 0: ${lp}`);
  const sum = logprobs.reduce((s, lp) => s + Math.exp(lp), 0);
  assert.ok(sum <= 1 + 1e-9, `${what}: the probabilities sum to ${sum} > 1`);
}

// Reads a chat stream: its text, the entries of each chunk, and checks on the
// way that the entries never run ahead of the text.
async function consumeChat(stream, what) {
  const out = { text: '', entries: [], chunksWithEntries: 0, finish: null, usage: null, spillways: [] };
  await bounded((async () => {
    for await (const chunk of stream) {
      if (chunk.spillway) out.spillways.push(chunk.spillway);
      if (chunk.usage) out.usage = chunk.usage;
      for (const c of chunk.choices ?? []) {
        out.text += c.delta?.content ?? '';
        if (c.logprobs) {
          assert.ok(Array.isArray(c.logprobs.content), `chunk logprobs: ${JSON.stringify(c.logprobs)}`);
          assert.equal(c.logprobs.refusal, null);
          out.entries.push(...c.logprobs.content);
          out.chunksWithEntries++;
        }
        if (c.finish_reason) out.finish = c.finish_reason;
      }
      const listed = out.entries.map((e) => e.token).join('');
      assert.ok(out.text.startsWith(listed), `${what}: entries ran ahead of the text: ${JSON.stringify(listed)} vs ${JSON.stringify(out.text)}`);
    }
  })(), 60_000, what);
  return out;
}

// Reads a completions stream: its text and the per-chunk lists, concatenated.
async function consumeCompletion(stream, what) {
  const out = { text: '', tokens: [], token_logprobs: [], top_logprobs: [], text_offset: [], finish: null, spillways: [],
    error: null };
  await bounded((async () => {
    try {
      for await (const chunk of stream) {
        if (chunk.spillway) out.spillways.push(chunk.spillway);
        for (const c of chunk.choices ?? []) {
          out.text += c.text ?? '';
          if (c.logprobs) {
            for (const k of ['tokens', 'token_logprobs', 'top_logprobs', 'text_offset']) out[k].push(...c.logprobs[k]);
          }
          if (c.finish_reason) out.finish = c.finish_reason;
        }
        assert.ok(out.text.startsWith(out.tokens.join('')), `${what}: entries ran ahead of the text`);
      }
    } catch (e) {
      out.error = e;
    }
  })(), 60_000, what);
  return out;
}

// The same tokens with the same numbers (batching and streaming change timing,
// never what the model computed).
function assertSameEntries(a, b, what) {
  assert.deepEqual(a.map((e) => e.token), b.map((e) => e.token), `${what}: tokens`);
  assert.deepEqual(a.map((e) => e.logprob), b.map((e) => e.logprob), `${what}: logprobs`);
  assert.deepEqual(a.map((e) => e.top_logprobs), b.map((e) => e.top_logprobs), `${what}: alternatives`);
}

async function expect400(promise, param, what) {
  const e = await bounded(promise.then(() => null, (err) => err), 30_000, what);
  assert.ok(e instanceof OpenAI.APIError, `${what}: expected a 400, got ${e}`);
  assert.equal(e.status, 400, `${what}: ${e.message}`);
  assert.equal(e.error?.param, param, `${what}: ${JSON.stringify(e.error)}`);
  assert.equal(e.error?.type, 'invalid_request_error', `${what}: ${JSON.stringify(e.error)}`);
  return e.error;
}

describe('logprobs through the openai client', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `spw-npm-logprobs-${process.pid}-`));
  let S; // cpu, two workers (batched), a journal
  let M; // gpu + cpu, for a migration (when there is a Vulkan device)

  before(async () => {
    [S, M] = await Promise.all([
      startServer('S', ['--parallel', '2', '--journal', path.join(tmp, 's.sqlite')]),
      startServer('M', ['--device', 'vulkan', '--replica', 'mmap', '--checkpoint-every', '4', '--admin-token', TOKEN,
        '--breaker-cooldown-s', '1', '--breaker-max-cooldown-s', '1',
        '--health-interval-s', '0', '--journal', path.join(tmp, 'm.sqlite')]),
    ]);
    console.log(`S: ${S.ready}\nM: ${M.ready}`);
  });

  after(async () => {
    await Promise.all([killServer(S), killServer(M)]);
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('completions: tokens, token_logprobs, top_logprobs with the chosen token, text_offset from the prompt', async () => {
    const data = await bounded(S.client.completions.create(
      { model: 'stories260K', prompt: PROMPT, temperature: 0, max_tokens: 24, logprobs: 3 }), 60_000, 'completion');
    const choice = data.choices[0];
    const lp = choice.logprobs;
    assert.ok(lp, `logprobs: ${JSON.stringify(choice)}`);
    assert.equal(choice.finish_reason, 'length');
    assert.equal(lp.tokens.length, data.usage.completion_tokens, 'one entry per generated token');
    assert.equal(lp.tokens.join(''), choice.text, 'the tokens are the text');
    assert.equal(lp.token_logprobs.length, lp.tokens.length);
    let offset = PROMPT.length;
    for (let i = 0; i < lp.tokens.length; i++) {
      const top = lp.top_logprobs[i];
      const keys = Object.keys(top);
      assert.ok(keys.length >= 1 && keys.length <= 4, `3 alternatives and the chosen one: ${JSON.stringify(top)}`);
      assert.equal(top[lp.tokens[i]], lp.token_logprobs[i], `the chosen token is among them: ${JSON.stringify(top)}`);
      assertDistribution(Object.values(top).sort((a, b) => b - a), `top_logprobs[${i}]`);
      // Greedy with no penalty: the chosen token is the most likely one.
      assert.equal(Math.max(...Object.values(top)), lp.token_logprobs[i], `greedy at ${i}: ${JSON.stringify(top)}`);
      assert.equal(lp.text_offset[i], offset, `text_offset[${i}]`);
      offset += [...lp.tokens[i]].length;
    }
    // Not asked: null.
    const plain = await bounded(S.client.completions.create(
      { model: 'stories260K', prompt: PROMPT, temperature: 0, max_tokens: 4 }), 60_000, 'plain completion');
    assert.equal(plain.choices[0].logprobs, null);
  });

  it('chat: content entries with token, logprob, bytes and top_logprobs; a greedy choice is the first alternative', async () => {
    const data = await bounded(S.client.chat.completions.create(
      { model: 'stories260K', messages: MESSAGES, temperature: 0, max_tokens: 24, logprobs: true, top_logprobs: 5 }),
    60_000, 'chat');
    const choice = data.choices[0];
    const content = choice.logprobs?.content;
    assert.ok(Array.isArray(content), `logprobs: ${JSON.stringify(choice.logprobs)}`);
    assert.equal(choice.logprobs.refusal, null);
    assert.equal(content.map((e) => e.token).join(''), choice.message.content, 'the tokens are the text');
    if (choice.finish_reason === 'length') assert.equal(content.length, data.usage.completion_tokens);
    for (const [i, e] of content.entries()) {
      assert.equal(Buffer.from(e.bytes).toString('utf8'), e.token, `bytes of ${JSON.stringify(e)}`);
      assert.equal(e.top_logprobs.length, 5);
      assertDistribution(e.top_logprobs.map((t) => t.logprob), `content[${i}].top_logprobs`);
      assert.equal(e.top_logprobs[0].token, e.token, `greedy: the chosen token is the most likely at ${i}`);
      assert.equal(e.top_logprobs[0].logprob, e.logprob);
      for (const t of e.top_logprobs) assert.ok(Array.isArray(t.bytes), JSON.stringify(t));
    }
    // logprobs alone: entries without alternatives. Not asked: null.
    const bare = await bounded(S.client.chat.completions.create(
      { model: 'stories260K', messages: MESSAGES, temperature: 0, max_tokens: 4, logprobs: true }), 60_000, 'bare');
    for (const e of bare.choices[0].logprobs.content) assert.deepEqual(e.top_logprobs, []);
    const plain = await bounded(S.client.chat.completions.create(
      { model: 'stories260K', messages: MESSAGES, temperature: 0, max_tokens: 4 }), 60_000, 'plain chat');
    assert.equal(plain.choices[0].logprobs, null);
  });

  it('streamed chat: each chunk carries its tokens\' entries, together the text, as the whole response has them', async () => {
    const req = { model: 'stories260K', messages: MESSAGES, temperature: 0, max_tokens: 40, logprobs: true, top_logprobs: 3 };
    const out = await consumeChat(await bounded(S.client.chat.completions.create(
      { ...req, stream: true, stream_options: { include_usage: true } }), 60_000, 'stream'), 'streamed chat');
    assert.ok(out.text.length > 0);
    assert.equal(out.entries.map((e) => e.token).join(''), out.text, 'the streamed entries\' tokens are the streamed text');
    if (out.finish === 'length') assert.equal(out.entries.length, out.usage.completion_tokens);
    assert.ok(out.chunksWithEntries > 1, 'entries come with their chunks, not at the end');
    for (const [i, e] of out.entries.entries()) {
      assertDistribution(e.top_logprobs.map((t) => t.logprob), `streamed entry ${i}`);
      assert.ok(Math.exp(e.logprob) <= 1);
    }
    const whole = await bounded(S.client.chat.completions.create(req), 60_000, 'whole');
    assert.equal(whole.choices[0].message.content, out.text);
    assertSameEntries(out.entries, whole.choices[0].logprobs.content, 'streamed vs whole');
  });

  it('streamed completions with a stop string: the token completing it is not listed, none runs ahead', async () => {
    const ref = await bounded(S.client.completions.create(
      { model: 'stories260K', prompt: PROMPT, temperature: 0, max_tokens: 40 }), 60_000, 'reference');
    const text = ref.choices[0].text;
    // A stop string that starts inside a token ("ily" of " Lily") when it
    // occurs, else the middle of the text.
    const stop = text.includes('ily') ? 'ily' : text.slice(Math.floor(text.length / 2), Math.floor(text.length / 2) + 3);
    const out = await consumeCompletion(await bounded(S.client.completions.create(
      { model: 'stories260K', prompt: PROMPT, temperature: 0, max_tokens: 40, logprobs: 1, stop, stream: true }),
    60_000, 'stop stream'), 'stop stream');
    assert.equal(out.error, null, `${out.error}`);
    assert.equal(out.finish, 'stop');
    assert.equal(out.text, text.slice(0, text.indexOf(stop)));
    const listed = out.tokens.join('');
    assert.ok(out.text.startsWith(listed), 'the listed tokens are the text\'s');
    assert.ok(!listed.includes(stop), 'no token of the stop string');
    const whole = await bounded(S.client.completions.create(
      { model: 'stories260K', prompt: PROMPT, temperature: 0, max_tokens: 40, logprobs: 1, stop }), 60_000, 'stop whole');
    assert.ok(whole.choices[0].logprobs.tokens.length < whole.usage.completion_tokens,
      'the token that completed the stop string is generated, not listed');
    assert.deepEqual(out.tokens, whole.choices[0].logprobs.tokens);
    assert.deepEqual(out.token_logprobs, whole.choices[0].logprobs.token_logprobs);
    assert.deepEqual(out.text_offset, whole.choices[0].logprobs.text_offset);
  });

  it('two streams batched together report what each reports alone', async () => {
    const req = (content) => ({ model: 'stories260K', messages: [{ role: 'user', content }], temperature: 0,
      max_tokens: 48, logprobs: true, top_logprobs: 2 });
    const prompts = ['Tell me about a cat.', 'Once there was a big red ball.'];
    const alone = [];
    for (const p of prompts) alone.push(await bounded(S.client.chat.completions.create(req(p)), 60_000, 'alone'));
    const together = await Promise.all(prompts.map(async (p) => consumeChat(
      await bounded(S.client.chat.completions.create({ ...req(p), stream: true }), 60_000, 'together'), 'together')));
    for (let i = 0; i < prompts.length; i++) {
      assert.equal(together[i].text, alone[i].choices[0].message.content);
      assertSameEntries(together[i].entries, alone[i].choices[0].logprobs.content, `prompt ${i}`);
    }
  });

  it('bad values are 400s naming the field: top_logprobs without logprobs, ranges, a seed past 2^53 - 1', async () => {
    const chat = { model: 'stories260K', messages: MESSAGES, max_tokens: 2 };
    const e = await expect400(S.client.chat.completions.create({ ...chat, top_logprobs: 2 }), 'top_logprobs',
      'top_logprobs without logprobs');
    assert.match(e.message, /"logprobs": true/);
    await expect400(S.client.chat.completions.create({ ...chat, logprobs: false, top_logprobs: 2 }), 'top_logprobs',
      'top_logprobs with logprobs false');
    await expect400(S.client.chat.completions.create({ ...chat, logprobs: true, top_logprobs: 21 }), 'top_logprobs',
      'top_logprobs 21');
    await expect400(S.client.completions.create({ model: 'stories260K', prompt: PROMPT, logprobs: 6 }), 'logprobs',
      'logprobs 6');
    const s = await expect400(S.client.completions.create({ model: 'stories260K', prompt: PROMPT, seed: 2 ** 53 }), 'seed',
      'seed 2^53');
    assert.match(s.message, /-9007199254740991, 9007199254740991/);
    await expect400(S.client.chat.completions.create({ ...chat, seed: -(2 ** 53) }), 'seed', 'seed -2^53');
    // The edges are fine.
    const ok = await bounded(S.client.completions.create(
      { model: 'stories260K', prompt: PROMPT, seed: 2 ** 53 - 1, max_tokens: 2 }), 60_000, 'seed 2^53 - 1');
    assert.equal(ok.spillway.seed, 2 ** 53 - 1);
    // A server-chosen seed is one a client can send back.
    const chosen = await bounded(S.client.completions.create(
      { model: 'stories260K', prompt: PROMPT, max_tokens: 2 }), 60_000, 'server seed');
    assert.ok(Number.isSafeInteger(chosen.spillway.seed), `seed ${chosen.spillway.seed}`);
  });

  it('a replay by Idempotency-Key answers with the stored text and "logprobs": null', async () => {
    const body = { model: 'stories260K', prompt: PROMPT, temperature: 0, max_tokens: 6, logprobs: 2 };
    const headers = { 'Idempotency-Key': `logprobs-${process.pid}` };
    const first = await bounded(S.client.completions.create(body, { headers }), 60_000, 'first');
    assert.ok(first.choices[0].logprobs);
    const again = await bounded(S.client.completions.create(body, { headers }), 60_000, 'replay');
    assert.equal(again.spillway.replayed, true);
    assert.equal(again.choices[0].text, first.choices[0].text);
    assert.equal(again.choices[0].logprobs, null, 'the journal keeps no entries');
  });

  it('a device loss mid-stream migrates the stream to the cpu path; entries go on, none repeated or skipped', async (t) => {
    if (!M.gpu) return t.skip(`no gpu path (no Vulkan device): ${M.ready}`);
    const MAX = 60;
    // Stop strings that never complete but whose first letter ends most
    // tokens: the text (and so the entries) of the last token is held at
    // almost every boundary, the one the stream migrates from included, so
    // the checkpoint it continues from holds entries not sent yet.
    const stop = [...'abdeghklnorstwy'].map((c) => `${c}!!`);
    const req = { model: 'stories260K', prompt: PROMPT, temperature: 0, max_tokens: MAX, logprobs: 2, stop };
    const ref = await bounded(M.client.completions.create(req), 60_000, 'gpu reference');
    assert.equal(ref.spillway.path, 'gpu', JSON.stringify(ref.spillway));
    assert.equal(ref.choices[0].finish_reason, 'length', 'no stop string occurs');
    const armed = await fetch(`${M.base}/v1/admin/faults`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${TOKEN}` },
      body: JSON.stringify({ path: 'gpu', kind: 'device_lost', after_submits: 20, count: 1 }),
      signal: AbortSignal.timeout(30_000),
    });
    assert.equal(armed.status, 201, await armed.text());
    const out = await consumeCompletion(await bounded(M.client.completions.create({ ...req, stream: true }), 60_000,
      'migrating stream'), 'migrating stream');
    assert.equal(out.error, null, `the stream failed: ${out.error?.message}`);
    const last = out.spillways.at(-1);
    assert.equal(last.migrations, 1, `it migrated: ${JSON.stringify(last)}`);
    assert.equal(out.text, ref.choices[0].text, 'the same greedy text');
    assert.equal(out.tokens.length, MAX, 'one entry per token, none repeated or skipped');
    assert.equal(out.tokens.join(''), out.text);
    assert.deepEqual(out.tokens, ref.choices[0].logprobs.tokens);
    assert.deepEqual(out.text_offset, ref.choices[0].logprobs.text_offset);
    // The cpu path's numbers are its own, close to the gpu's.
    for (let i = 0; i < MAX; i++) {
      assert.ok(Math.abs(out.token_logprobs[i] - ref.choices[0].logprobs.token_logprobs[i]) < 1e-3,
        `token ${i}: ${out.token_logprobs[i]} vs ${ref.choices[0].logprobs.token_logprobs[i]}`);
    }
  });
});
