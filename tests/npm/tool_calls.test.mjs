// Tool calls through the official `openai` npm client against `spillway serve`
// (the real binary, CPU path). The model is an echo model made here with
// `spillway-gen-model --echo-period L` (the bundled model's vocabulary; no
// chat template, so the default chatml one, which renders tools as Qwen2.5
// does): its greedy answer replays the prompt's last L tokens. The user
// message ends with a Hermes/Qwen tool call, so the answer is that call
// followed by the template's "<|im_end|>", which ends it: a real model run
// through the real engine whose output is known. L is counted with
// `spillway tokenize` on the same vocabulary.
//
// Checks: the call parsed into tool_calls (content null, finish_reason
// "tool_calls"), the same call streamed as one delta, a retry with the same
// Idempotency-Key replaying the same call id, the next turn (assistant
// tool_calls + tool result) accepted, and tool_choice values that would
// force a call refused by name.
//
// Run by ctest (npm_tool_calls_test) with SPILLWAY_BINARY, SPILLWAY_GEN_MODEL
// and SPILLWAY_SOURCE_DIR set. Bounded waits; loopback only; the server is
// killed in the after hook.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BINARY, MODEL, OpenAI, SLOWDOWN, killServer, spawnServer } from './harness.mjs';

const GEN_MODEL = process.env.SPILLWAY_GEN_MODEL || path.join(path.dirname(BINARY), 'spillway-gen-model');
const CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}\n</tool_call>\n';
// What the chatml template writes after the user's text.
const TURN_END = '<|im_end|>\n<|im_start|>assistant\n';
const TOOLS = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string' } }, required: ['city'] },
  },
}];
const MESSAGES = [{ role: 'user', content: 'What is the weather in Paris?\n' + CALL }];

function tokenCount(text) {
  const r = spawnSync(BINARY, ['tokenize', '--model', MODEL, '--no-bos', '--special', text], { encoding: 'utf8', timeout: 30_000 });
  assert.equal(r.status, 0, r.stderr);
  return JSON.parse(r.stdout).length;
}

describe('tool calls through the openai client', () => {
  let srv;
  let client;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spw-npm-tools-'));

  before(async () => {
    // The replayed span: the call and the turn's end, as tokenized after the
    // newline that precedes it in the prompt (a newline is a byte token of
    // its own in this vocabulary, so counting after one is exact).
    const period = tokenCount('\n' + CALL + TURN_END) - tokenCount('\n');
    const model = path.join(dir, 'echo.gguf');
    const gen = spawnSync(GEN_MODEL, ['--echo-period', String(period), '--vocab', MODEL, '--out', model, '--ctx', '1024'],
                          { encoding: 'utf8', timeout: 60_000 });
    assert.equal(gen.status, 0, `${GEN_MODEL} failed (${gen.error ?? ''}):\n${gen.stdout}\n${gen.stderr}`);
    srv = await spawnServer('tools', ['serve', '--model', model, '--port', '0', '--journal', path.join(dir, 'j.sqlite')]);
    client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOWDOWN });
  });
  after(async () => {
    await killServer(srv);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  const expectWeatherCall = (call) => {
    assert.equal(call.type, 'function');
    assert.equal(call.function.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', unit: 'celsius' });
    assert.match(call.id, /^call_\d+_0$/);
  };

  it('the model\'s call comes back as tool_calls with finish_reason tool_calls, and a retry replays it', async () => {
    const body = { messages: MESSAGES, tools: TOOLS, temperature: 0, max_tokens: 200 };
    const r = await client.chat.completions.create(body, { headers: { 'Idempotency-Key': 'tool-call-1' } });
    const choice = r.choices[0];
    assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
    assert.equal(choice.message.content, null);
    assert.equal(choice.message.tool_calls.length, 1);
    expectWeatherCall(choice.message.tool_calls[0]);
    // The same key: the stored answer, the same call under the same id.
    const again = await client.chat.completions.create(body, { headers: { 'Idempotency-Key': 'tool-call-1' } });
    assert.equal(again.spillway.replayed, true);
    assert.deepEqual(again.choices[0].message.tool_calls, choice.message.tool_calls);
  });

  it('streamed, the call arrives as one tool_calls delta and no content', async () => {
    const stream = await client.chat.completions.create(
      { messages: MESSAGES, tools: TOOLS, temperature: 0, max_tokens: 200, stream: true });
    const calls = [];
    let content = '';
    let finish = null;
    for await (const chunk of stream) {
      if (chunk.choices.length === 0) continue;
      const c = chunk.choices[0];
      content += c.delta.content ?? '';
      for (const t of c.delta.tool_calls ?? []) calls.push(t);
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(content, '');
    assert.equal(finish, 'tool_calls');
    assert.equal(calls.length, 1, JSON.stringify(calls));
    assert.equal(calls[0].index, 0);
    expectWeatherCall(calls[0]);
  });

  it('the next turn with the call and its result is accepted', async () => {
    const first = await client.chat.completions.create({ messages: MESSAGES, tools: TOOLS, temperature: 0, max_tokens: 200 });
    const call = first.choices[0].message.tool_calls[0];
    const r = await client.chat.completions.create({
      messages: [...MESSAGES, { role: 'assistant', content: null, tool_calls: [call] },
                 { role: 'tool', tool_call_id: call.id, content: '{"temperature": 21}' }],
      tools: TOOLS, temperature: 0, max_tokens: 8 });
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.ok(r.usage.prompt_tokens > first.usage.prompt_tokens);
  });

  it('a tool_choice that forces a call, and malformed tools, are refused by name', async () => {
    for (const [extra, param] of [[{ tool_choice: 'required' }, 'tool_choice'],
                                  [{ tool_choice: { type: 'function', function: { name: 'get_weather' } } }, 'tool_choice'],
                                  [{ tools: [{ type: 'function', function: { name: 'bad name' } }] }, 'tools[0].function.name']]) {
      await assert.rejects(client.chat.completions.create({ messages: MESSAGES, tools: TOOLS, ...extra }), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${e.constructor.name}: ${e.message}`);
        assert.equal(e.param, param, e.message);
        return true;
      });
    }
    await assert.rejects(client.chat.completions.create({
      messages: [{ role: 'assistant', content: null, tool_calls: [{ id: 'x', type: 'function', function: { name: 'f', arguments: '[1]' } }] }],
      tools: TOOLS }), (e) => e instanceof OpenAI.BadRequestError && e.param === 'messages[0].tool_calls[0].function.arguments');
  });
});

// The same through Mistral v3's format (`--chat-template mistral-v3`, rendered
// as Mistral-7B-Instruct-v0.3's template): the user message ends with a
// Mistral call and "</s>" (EOS, read as the token, as llama.cpp's server
// does), so the echo model answers with the call and stops at EOS. Once with
// the "[TOOL_CALLS]" marker as text, once without it (real Mistral
// vocabularies have it as a control token that renders as nothing).
const M_ARRAY = '[{"name": "get_weather", "arguments": {"city": "Paris", "unit": "celsius"}}]';
for (const [label, call] of [['with the [TOOL_CALLS] marker', '[TOOL_CALLS] ' + M_ARRAY], ['as a bare array', M_ARRAY]]) {
  describe(`Mistral v3 tool calls through the openai client, ${label}`, () => {
    let srv;
    let client;
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'spw-npm-mtools-'));
    const messages = [{ role: 'user', content: 'What is the weather in Paris?\n' + call + '</s>' }];

    before(async () => {
      const period = tokenCount('\n' + call + '</s>[/INST]') - tokenCount('\n');
      const model = path.join(dir, 'echo.gguf');
      const gen = spawnSync(GEN_MODEL, ['--echo-period', String(period), '--vocab', MODEL, '--out', model, '--ctx', '1024'],
                            { encoding: 'utf8', timeout: 60_000 });
      assert.equal(gen.status, 0, `${GEN_MODEL} failed (${gen.error ?? ''}):\n${gen.stdout}\n${gen.stderr}`);
      srv = await spawnServer('mtools', ['serve', '--model', model, '--port', '0', '--chat-template', 'mistral-v3',
                                         '--journal', path.join(dir, 'j.sqlite')]);
      client = new OpenAI({ baseURL: srv.base + '/v1', apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOWDOWN });
    });
    after(async () => {
      await killServer(srv);
      fs.rmSync(dir, { recursive: true, force: true });
    });

    it('the call comes back as tool_calls with a 9-character id, streamed alike, and the next turn renders', async () => {
      const body = { messages, tools: TOOLS, temperature: 0, max_tokens: 200 };
      const r = await client.chat.completions.create(body, { headers: { 'Idempotency-Key': 'mistral-call-1' } });
      const choice = r.choices[0];
      assert.equal(choice.finish_reason, 'tool_calls', JSON.stringify(choice));
      assert.equal(choice.message.content, null);
      assert.equal(choice.message.tool_calls.length, 1);
      const c = choice.message.tool_calls[0];
      assert.equal(c.function.name, 'get_weather');
      assert.deepEqual(JSON.parse(c.function.arguments), { city: 'Paris', unit: 'celsius' });
      assert.match(c.id, /^[A-Za-z0-9]{9}$/);
      const again = await client.chat.completions.create(body, { headers: { 'Idempotency-Key': 'mistral-call-1' } });
      assert.equal(again.spillway.replayed, true);
      assert.deepEqual(again.choices[0].message.tool_calls, choice.message.tool_calls);

      const stream = await client.chat.completions.create({ ...body, stream: true });
      const deltas = [];
      let content = '';
      for await (const chunk of stream) {
        if (chunk.choices.length === 0) continue;
        content += chunk.choices[0].delta.content ?? '';
        for (const t of chunk.choices[0].delta.tool_calls ?? []) deltas.push(t);
      }
      assert.equal(content, '');
      assert.equal(deltas.length, 1, JSON.stringify(deltas));
      assert.equal(deltas[0].function.name, 'get_weather');

      // The template insists on 9-character ids: ours pass, another is a 400.
      const next = await client.chat.completions.create({
        messages: [...messages, { role: 'assistant', content: null, tool_calls: [c] },
                   { role: 'tool', tool_call_id: c.id, content: '{"temperature": 21}' }],
        tools: TOOLS, temperature: 0, max_tokens: 8 });
      assert.ok(next.usage.prompt_tokens > r.usage.prompt_tokens);
      await assert.rejects(client.chat.completions.create({
        messages: [...messages, { role: 'assistant', content: null, tool_calls: [{ ...c, id: 'call_1' }] },
                   { role: 'tool', tool_call_id: 'call_1', content: '21' }],
        tools: TOOLS, max_tokens: 8 }), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${e.constructor.name}: ${e.message}`);
        assert.match(e.message, /9 characters/);
        return true;
      });
    });
  });
}
