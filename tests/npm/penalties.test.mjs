// Acceptance test of OpenAI's logit_bias, frequency_penalty and
// presence_penalty, and of vLLM's ignore_eos, min_tokens, stop_token_ids,
// repetition_penalty and skip_special_tokens, on `spillway serve` (the real
// binary, the bundled stories260K model, the CPU path) driven by the official
// `openai` npm client:
//  - logit_bias -100 on the token greedy decoding writes first: the text
//    changes and that token never appears; +100 on one token: every
//    generated token is that token (greedy, sampled, and in a chat);
//  - a frequency_penalty changes a greedy text that repeats itself, and it
//    repeats less;
//  - stop_token_ids ends the text where that token would come; the EOS made
//    the argmax by a +100 bias ends a completion at once, min_tokens holds
//    it off, ignore_eos generates through it;
//  - out-of-range values, an id past the vocabulary, skip_special_tokens
//    false and vLLM's other parameters are 400s naming the parameter.
// Token ids come from `spillway tokenize --pieces` on the same model.
//
// Run by ctest (npm_penalties_test) as `node --test tests/npm/penalties.test.mjs`
// with SPILLWAY_BINARY and SPILLWAY_SOURCE_DIR set; the client comes from
// tests/npm/node_modules (scripts/setup runs `npm install` there). Every wait
// is bounded; the server listens on 127.0.0.1 only and is killed in the after
// hook whatever happens.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { BINARY, MODEL, OpenAI, SLOWDOWN, bounded as boundedBy, killServer, spawnServer } from './harness.mjs';

const PROMPT = 'Once upon a time';
const bounded = (promise, ms, what) => boundedBy(promise, ms, what, SLOWDOWN);

// The {id, piece, text} tokens the model's tokenizer makes of `text`.
function tokenize(text, flags = []) {
  const r = spawnSync(BINARY, ['tokenize', '--model', MODEL, '--pieces', '--no-bos', ...flags, text],
    { encoding: 'utf8', timeout: 30_000 * SLOWDOWN });
  assert.equal(r.status, 0, `spillway tokenize failed (${r.error ?? ''}):\n${r.stdout}\n${r.stderr}`);
  return JSON.parse(r.stdout);
}

// The id of the token whose text is `tokenText`, among the tokens of `context`.
function idOf(tokenText, context) {
  const t = tokenize(context).find((x) => x.text === tokenText);
  assert.ok(t, `no token with the text ${JSON.stringify(tokenText)} in ${JSON.stringify(context)}`);
  return t.id;
}

// How often the most frequent token text of a list occurs.
const maxRepeats = (tokens) => Math.max(...Object.values(tokens.reduce((m, t) => ({ ...m, [t]: (m[t] ?? 0) + 1 }), {})));

describe('logit_bias, penalties and vLLM end rules through the openai client', () => {
  let srv;
  let client;
  before(async () => {
    srv = await spawnServer('penalties', ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0',
      '--threads', '1', '--chat-template', 'chatml']);
    client = new OpenAI({ baseURL: `${srv.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 60_000 * SLOWDOWN });
  });
  after(async () => { await killServer(srv); });

  // A greedy completion of PROMPT with its tokens' texts (logprobs 0).
  const complete = async (extra, what) => {
    const r = await bounded(client.completions.create(
      { model: 'stories260K', prompt: PROMPT, temperature: 0, max_tokens: 24, logprobs: 0, ...extra }), 60_000, what);
    const c = r.choices[0];
    return { text: c.text, tokens: c.logprobs.tokens, finish: c.finish_reason, usage: r.usage };
  };

  it('-100 bans the token greedy decoding picks; +100 makes every token that one', async () => {
    const base = await complete({}, 'greedy');
    const first = base.tokens[0];
    const firstId = idOf(first, PROMPT + base.text);
    const banned = await complete({ logit_bias: { [firstId]: -100 } }, 'banned');
    assert.notEqual(banned.text, base.text);
    assert.ok(!banned.tokens.includes(first), `${JSON.stringify(first)} came anyway: ${JSON.stringify(banned.tokens)}`);

    const favourite = base.tokens[5];
    const favouriteId = idOf(favourite, PROMPT + base.text);
    for (const sampling of [{ temperature: 0 }, { temperature: 1, seed: 7 }]) {
      const forced = await complete({ max_tokens: 8, logit_bias: { [favouriteId]: 100 }, ...sampling }, 'forced');
      assert.deepEqual(forced.tokens, Array(8).fill(favourite), JSON.stringify(sampling));
      assert.equal(forced.text, favourite.repeat(8));
      assert.equal(forced.usage.completion_tokens, 8);
    }
    const chat = await bounded(client.chat.completions.create({ model: 'stories260K', max_tokens: 6, temperature: 0,
      messages: [{ role: 'user', content: 'Tell me a story.' }], logit_bias: { [favouriteId]: 100 } }), 60_000, 'chat');
    assert.equal(chat.choices[0].message.content, favourite.repeat(6));
  });

  it('a frequency_penalty changes a greedy text that repeats itself, which then repeats less', async () => {
    const base = await complete({ max_tokens: 40 }, 'greedy');
    assert.ok(maxRepeats(base.tokens) > 2, `the greedy text must repeat itself: ${JSON.stringify(base.tokens)}`);
    const penalized = await complete({ max_tokens: 40, frequency_penalty: 1.0 }, 'penalized');
    assert.notEqual(penalized.text, base.text);
    assert.ok(maxRepeats(penalized.tokens) < maxRepeats(base.tokens),
      `${JSON.stringify(penalized.tokens)} vs ${JSON.stringify(base.tokens)}`);
    const presence = await complete({ max_tokens: 40, presence_penalty: 1.5 }, 'presence_penalty');
    assert.notEqual(presence.text, base.text);
    // vLLM's repetition_penalty is repeat_penalty.
    const llama = await complete({ max_tokens: 40, repeat_penalty: 1.3 }, 'repeat_penalty');
    const vllm = await complete({ max_tokens: 40, repetition_penalty: 1.3 }, 'repetition_penalty');
    assert.equal(vllm.text, llama.text);
    assert.notEqual(vllm.text, base.text);
  });

  it('stop_token_ids, min_tokens and ignore_eos', async () => {
    const base = await complete({}, 'greedy');
    const stopText = base.tokens[4];
    const stopId = idOf(stopText, PROMPT + base.text);
    const stopped = await complete({ stop_token_ids: [stopId] }, 'stop_token_ids');
    const at = base.tokens.indexOf(stopText);
    assert.equal(stopped.finish, 'stop');
    assert.equal(stopped.text, base.tokens.slice(0, at).join(''));
    assert.equal(stopped.usage.completion_tokens, at);

    const [eos] = tokenize('</s>', ['--special']);
    const eosFirst = { logit_bias: { [eos.id]: 100 }, max_tokens: 20 };
    const none = await complete(eosFirst, 'EOS first');
    assert.equal(none.text, '');
    assert.equal(none.finish, 'stop');
    assert.equal(none.usage.completion_tokens, 0);
    const five = await complete({ ...eosFirst, min_tokens: 5 }, 'min_tokens');
    assert.equal(five.finish, 'stop');
    assert.equal(five.usage.completion_tokens, 5);
    assert.equal(five.text, base.tokens.slice(0, 5).join(''), 'until then the unbiased argmax, as greedy writes');
    const through = await complete({ ...eosFirst, max_tokens: 4, ignore_eos: true }, 'ignore_eos');
    assert.equal(through.finish, 'length');
    assert.equal(through.usage.completion_tokens, 4);
    assert.equal(through.text, '', 'an EOS adds no text');
  });

  it('refuses what it cannot do with 400s naming the parameter', async () => {
    const cases = [
      [{ logit_bias: { 1: 500 } }, 'logit_bias', 'invalid_value'],
      [{ logit_bias: { 100000: 1 } }, 'logit_bias', 'invalid_value'],
      [{ logit_bias: { x: 1 } }, 'logit_bias', 'invalid_value'],
      [{ frequency_penalty: 2.5 }, 'frequency_penalty', 'invalid_value'],
      [{ presence_penalty: -3 }, 'presence_penalty', 'invalid_value'],
      [{ stop_token_ids: [100000] }, 'stop_token_ids[0]', 'invalid_value'],
      [{ min_tokens: 30 }, 'min_tokens', 'invalid_value'],
      [{ skip_special_tokens: false }, 'skip_special_tokens', 'unsupported_parameter'],
      [{ use_beam_search: true }, 'use_beam_search', 'unknown_parameter'],
    ];
    for (const [extra, param, code] of cases) {
      await assert.rejects(complete(extra, JSON.stringify(extra)), (e) => {
        assert.ok(e instanceof OpenAI.BadRequestError, `${JSON.stringify(extra)}: ${e.constructor.name}: ${e.message}`);
        assert.equal(e.param, param, JSON.stringify(extra));
        assert.equal(e.code, code, `${JSON.stringify(extra)}: ${e.message}`);
        return true;
      });
    }
    const ok = await complete({ skip_special_tokens: true, max_tokens: 2 }, 'skip_special_tokens true');
    assert.equal(ok.usage.completion_tokens, 2);
  });
});
