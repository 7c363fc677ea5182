// What an OpenAI client expects of `spillway serve` (the real binary on the
// CPU path), through the official `openai` npm package:
// the model list with roles and aliases, model_not_found for other ids,
// completions and chat (the bundled model has no chat template: the default
// one is named), streaming with the usage chunk, max_completion_tokens,
// aborting a stream (the server cancels the request), and errors as the
// client's typed exceptions with `param` and `code`.
//
// The model is generated here with spillway-gen-model (3.7M parameters, the
// bundled model's tokenizer, no chat template): slow enough (~700 tokens/s)
// that a stream is still running when its client aborts it; the bundled
// 260K model writes 1500 tokens before the client reads its first chunk.
// Greedy decoding of these weights runs 1500 tokens without an EOS.
//
// Run by ctest (npm_openai_compat_test) with SPILLWAY_BINARY,
// SPILLWAY_GEN_MODEL and SPILLWAY_SOURCE_DIR set. Every wait is bounded; the server listens on
// 127.0.0.1 only and is killed in the after hook whatever happens.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { spawnSync } from 'node:child_process';
import { BINARY, MODEL, OpenAI, SLOWDOWN, killServer, sleep, spawnServer } from './harness.mjs';

const GEN_MODEL = process.env.SPILLWAY_GEN_MODEL || path.join(path.dirname(BINARY), 'spillway-gen-model');
const ID = 'compat-3m';

describe('OpenAI compatibility through the openai client', () => {
  let srv;
  let client;

  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spw-npm-compat-'));
  const journal = path.join(dir, 'journal.sqlite');
  const model = path.join(dir, `${ID}.gguf`);

  before(async () => {
    const gen = spawnSync(GEN_MODEL, ['--out', model, '--embd', '256', '--layers', '4', '--heads', '4', '--kv-heads', '4',
      '--ffn', '768', '--ctx', '2048', '--type', 'f32', '--vocab', MODEL], { encoding: 'utf8', timeout: 60_000 });
    assert.equal(gen.status, 0, `${GEN_MODEL} failed (${gen.error ?? ''}):\n${gen.stdout}\n${gen.stderr}`);
    srv = await spawnServer('compat', ['serve', '--model', model, '--port', '0', '--ctx', '2048', '--journal', journal,
                                       '--alias', 'gpt-4o-mini', '--alias', 'local/tiny']);
    client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOWDOWN });
  });
  after(async () => {
    await killServer(srv);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  const status = async () => (await fetch(srv.base + '/v1/status', { signal: AbortSignal.timeout(10_000) })).json();

  it('lists the served model and its aliases with their roles, and retrieves one', async () => {
    const ids = [];
    for await (const m of client.models.list()) ids.push([m.id, m.spillway.role, m.spillway.alias_of ?? null]);
    assert.deepEqual(ids, [[ID, 'primary', null], ['gpt-4o-mini', 'alias', ID],
                           ['local/tiny', 'alias', ID]]);
    const one = await client.models.retrieve('gpt-4o-mini');
    assert.equal(one.id, 'gpt-4o-mini');
    assert.equal(one.object, 'model');
    assert.equal(one.owned_by, 'spillway');
    await assert.rejects(client.models.retrieve('gpt-5'), (e) => {
      assert.ok(e instanceof OpenAI.NotFoundError, `${e.constructor.name}: ${e.message}`);
      assert.equal(e.code, 'model_not_found');
      return true;
    });
  });

  it('an alias runs the served model; an unknown model is a NotFoundError naming what is served', async () => {
    const r = await client.completions.create({ model: 'gpt-4o-mini', prompt: 'Once upon a time', max_tokens: 8,
                                                temperature: 0 });
    assert.equal(r.model, ID, 'the response names the model that ran');
    assert.equal(r.usage.completion_tokens, 8);
    for (const call of [
      () => client.completions.create({ model: 'gpt-5', prompt: 'hi', max_tokens: 2 }),
      () => client.chat.completions.create({ model: 'gpt-5', messages: [{ role: 'user', content: 'hi' }] }),
    ]) {
      await assert.rejects(call(), (e) => {
        assert.ok(e instanceof OpenAI.NotFoundError, `${e.constructor.name}: ${e.message}`);
        assert.equal(e.status, 404);
        assert.equal(e.code, 'model_not_found');
        assert.equal(e.param, 'model');
        assert.match(e.message, /gpt-4o-mini \(alias\)/);
        return true;
      });
    }
  });

  it('chat answers with the default template named, and streams with a usage chunk', async () => {
    const { data: chat, response } = await client.chat.completions
      .create({ model: ID, messages: [{ role: 'user', content: 'Tell me a story' }],
                max_completion_tokens: 12, temperature: 0 })
      .withResponse();
    assert.equal(chat.object, 'chat.completion');
    assert.equal(chat.choices[0].message.role, 'assistant');
    assert.equal(chat.usage.completion_tokens, 12, 'max_completion_tokens is the limit');
    assert.match(response.headers.get('x-spillway-chat-template'), /^chatml; default$/);

    const stream = await client.chat.completions.create({
      model: 'local/tiny', messages: [{ role: 'user', content: 'Tell me a story' }], max_tokens: 12, temperature: 0,
      stream: true, stream_options: { include_usage: true } });
    let text = '';
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.choices.length > 0) text += chunk.choices[0].delta.content ?? '';
      if (chunk.usage) usage = chunk.usage;
    }
    assert.equal(text, chat.choices[0].message.content, 'the stream says what the whole response said');
    assert.equal(usage.completion_tokens, 12);
  });

  it('aborting a stream cancels the request on the server', async () => {
    const before = (await status()).paths[0].requests.cancelled;
    const controller = new AbortController();
    const stream = await client.completions.create(
      { prompt: 'Once upon a time', max_tokens: 1500, temperature: 0, stream: true }, { signal: controller.signal });
    // The client's stream ends quietly on its own abort (no exception).
    for await (const _ of stream) controller.abort();
    const until = Date.now() + 10_000 * SLOWDOWN;
    for (;;) {
      const s = await status();
      if (s.paths[0].requests.cancelled > before && s.paths[0].running === 0) break;
      assert.ok(Date.now() < until, `the aborted stream was never cancelled: ${JSON.stringify(s.paths[0].requests)}`);
      await sleep(20);
    }
  });

  it('errors are the typed exceptions with param and code', async () => {
    const cases = [
      [{ prompt: 'hi', max_tokens: 0 }, 'max_tokens'],
      [{ prompt: 'hi', temperature: -1 }, 'temperature'],
      [{ prompt: 'hi', n: 17 }, 'n'],
      [{ prompt: 'hi', max_tokens: 4, max_completion_tokens: 5 }, 'max_completion_tokens'],
      [{ prompt: 'hi', frobnicate: true }, 'frobnicate'],
    ];
    for (const [body, param] of cases) {
      await assert.rejects(client.completions.create({ model: ID, ...body }), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${JSON.stringify(body)}: ${e.constructor.name}: ${e.message}`);
        assert.equal(e.param, param, e.message);
        assert.equal(e.type, 'invalid_request_error');
        return true;
      });
    }
  });
});
