// The status page of `spillway serve` (GET /) in a real headless browser:
// Debian's chromium driven by puppeteer-core (the npm package; it downloads
// no browser). The server runs with an API key, one worker and a generated
// model, its cpu path slowed by an armed slow fault (admin API) so that
// requests stay queued behind each other while the page is driven:
//   - the page asks for the key (the API answers 401 without it) and, once
//     given, shows the live figures of the running server: the host ledger's
//     timeline drawn against capacity and the safe limit, the cpu path with
//     its worker, queue and rates, and every request in flight with its
//     path, model, decision, queue position and estimated delay;
//   - a click on a queued request's Cancel button cancels it: the client
//     waiting for it gets its cancellation, and it leaves the list;
//   - the recent decisions with their reasons are listed;
//   - the catalogue's models are listed with their state (a --model spare=
//     beside the served one, never asked for: unloaded);
//   - a screenshot is kept as a test artefact (SPILLWAY_ARTIFACTS_DIR).
//
// Run by ctest (status_page_test) with SPILLWAY_BINARY, SPILLWAY_GEN_MODEL and
// SPILLWAY_SOURCE_DIR set; SPILLWAY_CHROMIUM names the browser (default: the
// first chromium on PATH). Loopback only; every wait is bounded; the server
// and the browser are killed in the after hook whatever happens.
import { after, before, describe, it } from 'node:test';
import assert from 'node:assert/strict';
import { spawnSync } from 'node:child_process';
import { createRequire } from 'node:module';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { BINARY, SLOWDOWN, SOURCE_DIR, bounded as boundedBy, killServer, sleep, slowCpuPath, spawnServer } from './harness.mjs';

const GEN_MODEL = process.env.SPILLWAY_GEN_MODEL || path.join(path.dirname(BINARY), 'spillway-gen-model');
const KEY = 'status-page-test-key';
const ADMIN = 'status-page-admin-token';
const bounded = (promise, ms, what) => boundedBy(promise, ms, what, SLOWDOWN);

function findChromium() {
  if (process.env.SPILLWAY_CHROMIUM) return process.env.SPILLWAY_CHROMIUM;
  for (const dir of (process.env.PATH || '/usr/bin').split(':')) {
    for (const name of ['chromium', 'chromium-browser', 'google-chrome']) {
      const p = path.join(dir, name);
      if (fs.existsSync(p)) return p;
    }
  }
  throw new Error('no chromium on PATH (scripts/setup installs Debian\'s); SPILLWAY_CHROMIUM names another');
}

async function loadPuppeteer() {
  try {
    const require = createRequire(path.join(SOURCE_DIR, 'tests', 'npm', 'package.json'));
    return (await import(require.resolve('puppeteer-core'))).default;
  } catch (e) {
    throw new Error(`puppeteer-core is not installed in tests/npm/node_modules: run scripts/setup [${e.message}]`);
  }
}

const startServer = (model) => spawnServer('status', ['serve', '--model', model, '--host', '127.0.0.1', '--port', '0',
  '--threads', '1', '--parallel', '1', '--queue', '8', '--journal', 'none', '--api-key', KEY,
  '--admin-token', ADMIN, '--model', `spare=${path.join(SOURCE_DIR, 'models', 'stories260K.gguf')}`]);

// A non-streaming completion; resolves with the HTTP status and body.
function complete(srv, prompt, maxTokens) {
  return fetch(`${srv.base}/v1/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
    body: JSON.stringify({ prompt, max_tokens: maxTokens, temperature: 0 }),
    signal: AbortSignal.timeout(120_000 * SLOWDOWN),
  }).then(async (r) => ({ status: r.status, body: await r.json() }));
}

async function inFlight(srv) {
  const r = await fetch(`${srv.base}/v1/requests`, { headers: { authorization: `Bearer ${KEY}` } });
  assert.equal(r.status, 200);
  return (await r.json()).data;
}

describe('the status page in headless chromium', () => {
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), `spw-status-page-${process.pid}-`));
  const artifacts = process.env.SPILLWAY_ARTIFACTS_DIR || tmp;
  let srv;
  let browser;
  let page;

  before(async () => {
    // Wide enough that a long prompt takes a while on one thread, so that
    // the next requests wait in the queue (prefill time does not depend on
    // when this random model samples its end-of-text token).
    const model = path.join(tmp, 'slow.gguf');
    const gen = spawnSync(GEN_MODEL, ['--out', model, '--embd', '256', '--layers', '6', '--heads', '8',
      '--kv-heads', '8', '--ffn', '768', '--ctx', '2048', '--vocab', path.join(SOURCE_DIR, 'models', 'stories260K.gguf')],
    { encoding: 'utf8', timeout: 120_000 });
    assert.equal(gen.status, 0, `${GEN_MODEL} failed:\n${gen.stdout}\n${gen.stderr}`);
    srv = await startServer(model);
    const puppeteer = await loadPuppeteer();
    browser = await bounded(puppeteer.launch({
      executablePath: findChromium(),
      headless: true,
      args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage', `--user-data-dir=${path.join(tmp, 'profile')}`],
    }), 60_000, 'launching chromium');
    page = await browser.newPage();
    await page.setViewport({ width: 1400, height: 1100 });
  });

  after(async () => {
    if (browser) await browser.close().catch(() => {});
    await killServer(srv);
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('asks for the key, shows the live figures, and a click cancels a queued request', async () => {
    const external = [];
    page.on('request', (r) => { if (!r.url().startsWith(srv.base)) external.push(r.url()); });
    await bounded(page.goto(`${srv.base}/`), 30_000, 'loading the page');
    // Without the key the API answers 401 and the page asks for one.
    await bounded(page.waitForSelector('#auth', { visible: true }), 10_000, 'the key form');
    await page.type('#key', KEY);
    await page.click('#auth-form button');
    await bounded(page.waitForFunction(() => Number(document.body.dataset.updates || 0) >= 2), 15_000,
      'two updates with the key');

    // Work: one request running, three waiting behind it, each with a
    // prompt of about 1,500 tokens (400 under a sanitizer). The cpu path is
    // slowed 50x (an armed slow fault) until the cancellation is seen, so
    // the last one is still queued when the page's button is clicked however
    // fast the machine (sizing the work instead lost that race to every
    // faster CPU path); the rest then finish at full speed.
    const restoreSpeed = await slowCpuPath(srv.base, ADMIN, 50);
    const repeats = SLOWDOWN > 1 ? 30 : 110;
    const prompt = (i) => `Story ${i}: ` + 'the little dog ran to the park and '.repeat(repeats);
    // Each request is sent once the previous one is listed, and known by the
    // request id it shows up with: requests sent 30 ms apart could reach the
    // server in either order on a loaded machine, and a victim chosen by its
    // place in the list was then another request than the one awaited.
    const seen = new Set();
    const arrival = (what) => bounded((async () => {
      for (;;) {
        const fresh = (await inFlight(srv)).filter((r) => !seen.has(r.request_id));
        assert.ok(fresh.length <= 1, `one new request at a time: ${JSON.stringify(fresh)}`);
        if (fresh.length === 1) {
          seen.add(fresh[0].request_id);
          return fresh[0].request_id;
        }
        await sleep(10);
      }
    })(), 30_000, what);
    const running = complete(srv, prompt(0), 32);
    await arrival('the first request listed');
    const queued = [];
    const queuedIds = [];
    for (let i = 1; i <= 3; i++) {
      queued.push(complete(srv, prompt(i), i < 3 ? 32 : 16));
      queuedIds.push(await arrival(`request ${i} listed`));
    }
    const listed = await bounded((async () => {
      for (;;) {
        const d = await inFlight(srv);
        if (d.length === 4 && d.filter((r) => r.state === 'queued').length === 3) return d;
        await sleep(20);
      }
    })(), 30_000, 'four requests in flight, three queued');
    const victimIndex = queued.length - 1;
    const victim = listed.find((r) => r.request_id === queuedIds[victimIndex]);
    assert.equal(victim?.state, 'queued', JSON.stringify(listed));

    // The page shows them: path, model, decision, queue position, delay.
    const row = `tr[data-request-id="${victim.request_id}"]`;
    await bounded(page.waitForSelector(row), 10_000, 'the queued request\'s row');
    const shown = await page.$eval(row, (tr) => ({
      text: tr.innerText,
      state: tr.dataset.state,
      position: tr.querySelector('.queue-position').textContent,
      delay: tr.querySelector('.delay').textContent,
    }));
    assert.equal(shown.state, 'queued', JSON.stringify(shown));
    assert.match(shown.text, /cpu/, 'its path');
    assert.match(shown.text, /slow/, 'its model');
    assert.match(shown.text, /delay/, 'its decision (it waits behind the others)');
    assert.ok(Number(shown.position) >= 1, `a queue position: ${JSON.stringify(shown)}`);
    assert.match(shown.delay, /^\d+(\.\d+)? (ms|s)$/, `an estimated delay: ${JSON.stringify(shown)}`);

    // The path and the memory timeline are live figures of this server.
    const pathRow = await page.$eval('tr[data-path="cpu"]', (tr) => tr.innerText);
    assert.match(pathRow, /cpu/);
    const ledger = await page.$eval('svg[data-ledger="host"]', (svg) => ({
      used: svg.querySelector('.used').getAttribute('points').split(' ').length,
      limit: svg.querySelector('.limit').getAttribute('points').split(' ').length,
      capacity: svg.querySelector('.capacity').getAttribute('points').split(' ').length,
    }));
    assert.ok(ledger.used >= 4 && ledger.limit >= 2 && ledger.capacity >= 2, JSON.stringify(ledger));
    // The catalogue's model (--model spare=...), not asked for yet.
    const spare = await page.$eval('#models tbody tr', (tr) => ({ state: tr.dataset.state, text: tr.innerText }));
    assert.equal(spare.state, 'unloaded', JSON.stringify(spare));
    assert.match(spare.text, /spare/);

    await page.screenshot({ path: path.join(artifacts, 'status_page.png'), fullPage: true });

    // Cancel through the page.
    await page.click(`${row} button.cancel`);
    const outcome = await bounded(queued[victimIndex], 60_000, 'the cancelled request\'s response');
    assert.match(JSON.stringify(outcome.body), /cancel/i, `the client sees its cancellation: ${JSON.stringify(outcome)}`);
    await bounded((async () => {
      while ((await inFlight(srv)).some((r) => r.request_id === victim.request_id)) await sleep(20);
    })(), 10_000, 'the cancelled request leaving the list');
    await bounded(page.waitForFunction((sel) => !document.querySelector(sel), {}, row), 10_000,
      'its row leaving the page');
    await restoreSpeed();

    // The decisions are listed with their reasons.
    await bounded(page.waitForFunction(() => document.querySelectorAll('#decisions tr[data-kind="delay"]').length >= 2),
      10_000, 'the delay decisions listed');
    const reason = await page.$eval('#decisions tr[data-kind="delay"]', (tr) => tr.innerText);
    assert.match(reason, /delay on cpu/, reason);
    assert.deepEqual(external, [], 'the page fetched nothing from anywhere else');
    // The others are not cancelled: they finish normally.
    const done = await bounded(Promise.all([running, ...queued.filter((_, i) => i !== victimIndex)]), 120_000,
      'the other requests');
    for (const d of done) assert.equal(d.status, 200, JSON.stringify(d.body));
  });
});
