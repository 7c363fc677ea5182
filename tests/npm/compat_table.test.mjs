// The OpenAI request-field compatibility table (docs/OPENAI_COMPAT.md) is
// what the server does: every row's value is sent, on each endpoint, to the
// real `spillway serve` (the bundled model, CPU, loopback), and the answer
// must be the row's verdict:
//   supported  200, and the field acts
//   accepted   200, and the field changes nothing (the row says why)
//   refused    400 whose error.param names the field
//   unknown    400 unknown_parameter: not a field of that endpoint
// The table also covers every field the server accepts: the list that an
// unknown parameter's 400 gives ("... accepts: a, b, ...") must be exactly
// the fields with a row not `unknown` on that endpoint, so a field added to
// the server without a row (or a row for a field it dropped) fails here.
//
// Run by ctest (npm_compat_table_test) as `node --test tests/npm/compat_table.test.mjs`.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { MODEL, SLOWDOWN, SOURCE_DIR, killServer, spawnServer } from './harness.mjs';

const TABLE = path.join(SOURCE_DIR, 'docs', 'OPENAI_COMPAT.md');
const ENDPOINTS = ['/v1/completions', '/v1/chat/completions'];
const BASE = {
  '/v1/completions': { prompt: 'Once upon a time', max_tokens: 4 },
  '/v1/chat/completions': { messages: [{ role: 'user', content: 'Once upon a time' }], max_tokens: 4 },
};
const VERDICTS = new Set(['supported', 'accepted', 'refused', 'unknown']);

// The rows between the table markers: { field, value (parsed JSON), verdicts
// per endpoint, with (extra fields the value needs, parsed JSON or {}) }.
function readTable() {
  const text = fs.readFileSync(TABLE, 'utf8');
  const body = text.split('<!-- compat-table:begin -->')[1]?.split('<!-- compat-table:end -->')[0];
  assert.ok(body, `${TABLE} has no compat-table markers`);
  const rows = [];
  for (const line of body.split('\n')) {
    if (!line.startsWith('| `')) continue;  // header, rule and blank lines
    const cells = line.split(' | ').map((c) => c.replace(/^\|\s*/, '').replace(/\s*\|$/, '').trim());
    assert.ok(cells.length >= 6, `a row needs 6 cells: ${line}`);
    const code = (c) => c.replace(/^`/, '').replace(/`$/, '');
    const row = {
      field: code(cells[0]),
      value: JSON.parse(code(cells[1])),
      verdicts: { '/v1/completions': cells[2], '/v1/chat/completions': cells[3] },
      with: cells[4] === '' ? {} : JSON.parse(code(cells[4])),
      line,
    };
    for (const v of Object.values(row.verdicts)) assert.ok(VERDICTS.has(v), `verdict "${v}" in: ${line}`);
    rows.push(row);
  }
  assert.ok(rows.length > 20, `only ${rows.length} rows read from ${TABLE}`);
  return rows;
}

describe('the OpenAI compatibility table', () => {
  let S;
  const rows = readTable();

  before(async () => {
    S = await spawnServer('S', ['serve', '--model', MODEL, '--host', '127.0.0.1', '--port', '0', '--threads', '1',
      '--journal', 'none']);
  });
  after(async () => { await killServer(S); });

  async function post(route, body) {
    const r = await fetch(S.base + route, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify(body),
      signal: AbortSignal.timeout(60_000 * SLOWDOWN),
    });
    const text = await r.text();
    let json;
    try { json = JSON.parse(text); } catch { json = undefined; }
    return { status: r.status, json, text };
  }

  it('every row is what the server does, on both endpoints', async () => {
    const wrong = [];
    for (const row of rows) {
      for (const route of ENDPOINTS) {
        const verdict = row.verdicts[route];
        const body = { ...BASE[route], ...row.with, [row.field]: row.value };
        const r = await post(route, body);
        const err = r.json?.error ?? {};
        let ok;
        if (verdict === 'supported' || verdict === 'accepted') ok = r.status === 200;
        else if (verdict === 'refused') ok = r.status === 400 && String(err.param ?? '').startsWith(row.field) && err.code !== 'unknown_parameter';
        else ok = r.status === 400 && err.code === 'unknown_parameter';
        if (!ok) wrong.push(`${route} ${row.field}=${JSON.stringify(row.value)}: table says ${verdict}, got ${r.status} ${r.text.slice(0, 300)}`);
      }
    }
    assert.deepEqual(wrong, [], wrong.join('\n'));
  });

  it('the table has a row for every field the server accepts, and none for a field it does not', async () => {
    for (const route of ENDPOINTS) {
      const r = await post(route, { ...BASE[route], no_such_field_x: 1 });
      assert.equal(r.status, 400, r.text);
      const m = r.json.error.message.match(/accepts: (.*)\)$/);
      assert.ok(m, `the unknown-parameter message lists the accepted fields: ${r.json.error.message}`);
      const accepted = new Set(m[1].split(', '));
      const documented = new Set(rows.filter((row) => row.verdicts[route] !== 'unknown').map((row) => row.field));
      assert.deepEqual([...accepted].filter((f) => !documented.has(f)), [], `${route}: accepted but not in the table`);
      assert.deepEqual([...documented].filter((f) => !accepted.has(f)), [], `${route}: in the table but not accepted`);
    }
  });
});
