// End-to-end: the status page (GET /) in headless Chromium (Debian's `chromium`, driven by
// playwright-core) against `deltaserve serve` with models/tiny-coder on the CPU. The page's
// figures must equal what /metrics and /get_server_info say, the recent launches must show this
// launch with its bench measurement (table and SVG bar), the chat box must stream a reply, and
// with --api-key the page must ask for the key before showing anything.
// Without /usr/bin/chromium (or $DELTASERVE_CHROMIUM) the tests are reported skipped.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { chromium } from 'playwright-core';
import { startServer as launchServer, stopServer } from './server.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../..');
const BIN = process.env.DELTASERVE_BIN ?? path.join(repo, 'build/src/app/deltaserve');
const MODEL = process.env.DELTASERVE_E2E_MODEL ?? path.join(repo, 'models/tiny-coder');
const BUILD_DIR = process.env.DELTASERVE_BUILD_DIR ?? path.join(repo, 'build');
const CHROMIUM = process.env.DELTASERVE_CHROMIUM ?? '/usr/bin/chromium';
const HAVE_CHROMIUM = fs.existsSync(CHROMIUM);
const STATE_DIR = fs.mkdtempSync(path.join(os.tmpdir(), 'ds-e2e-status-'));

function startServer(extraArgs = []) {
  return launchServer(BIN, ['--state-dir', STATE_DIR,
    '--model-path', MODEL, '--context-length', '512', '--max-running-requests', '8', '--max-total-tokens', '16384',
    '--reasoning-parser', 'qwen3', '--served-model-name', 'tiny-coder', ...extraArgs]);
}

async function metrics(base, headers = {}) {
  const text = await (await fetch(`${base}/metrics`, { headers })).text();
  return (name) => {
    const m = text.match(new RegExp(`^${name.replace(/[:]/g, '\\$&')}(?:\\{[^}]*\\})? (\\S+)$`, 'm'));
    assert.ok(m, `${name} not in /metrics`);
    return Number(m[1]);
  };
}

async function waitIdle(base, headers = {}) {
  const deadline = Date.now() + 30000;
  for (;;) {
    const v = await metrics(base, headers);
    if (['deltaserve_requests_running', 'deltaserve_requests_waiting', 'deltaserve_kv_tokens_used'].every((n) => v(n) === 0)) return v;
    assert.ok(Date.now() < deadline, 'the server did not go idle');
    await new Promise((r) => setTimeout(r, 50));
  }
}

// The page's text for an element id.
const text = (page, id) => page.locator(`#${id}`).textContent();

let browser;
before(async () => {
  if (HAVE_CHROMIUM) browser = await chromium.launch({ executablePath: CHROMIUM, args: ['--no-sandbox'] });
});
after(async () => { if (browser) await browser.close(); });

test('status page: plan, live figures, launches, chat', async (t) => {
  if (!HAVE_CHROMIUM) { t.skip(`no Chromium at ${CHROMIUM} (apt-get install chromium)`); return; }
  const srv = await startServer(['--speculative-algorithm', 'NEXTN', '--speculative-num-steps', '2']);
  const page = await browser.newPage({ viewport: { width: 1280, height: 1100 } });
  const consoleErrors = [];
  page.on('console', (m) => { if (m.type() === 'error') consoleErrors.push(m.text()); });
  page.on('pageerror', (e) => consoleErrors.push(e.message));
  try {
    const info = await (await fetch(`${srv.base}/get_server_info`)).json();
    assert.ok(info.launch_id > 0, JSON.stringify(info));
    // A measurement for this launch, so the launches table and plot have a figure to show.
    const bench = await new Promise((resolve) => execFile(BIN, ['bench', '--url', srv.base, '--concurrency', '1',
      '--num-prompts', '2', '--input-len', '16', '--output-len', '16', '--state-dir', STATE_DIR,
      '--output', path.join(STATE_DIR, 'bench.json')], { timeout: 120000 },
    (err, stdout, stderr) => resolve({ err, stdout, stderr })));
    assert.equal(bench.err, null, bench.stderr);
    const bestTps = JSON.parse(fs.readFileSync(path.join(STATE_DIR, 'bench.json'), 'utf8'));
    let v = await waitIdle(srv.base);

    const resp = await page.goto(`${srv.base}/`);
    assert.equal(resp.status(), 200);
    assert.match(resp.headers()['content-type'], /^text\/html/);
    // Two polls: the throughput between them is shown too.
    await page.waitForFunction(() => Number(document.body.dataset.polls || 0) >= 2, null, { timeout: 30000 });

    // The memory plan equals /get_server_info.
    assert.equal(await text(page, 'plan-kv-tokens'), String(info.max_total_num_tokens));
    assert.equal(await text(page, 'plan-kv-dtype'), String(info.kv_cache_dtype));
    assert.equal(await text(page, 'plan-max-running'), String(info.max_running_requests));
    assert.equal(await text(page, 'plan-context'), String(info.context_length));
    assert.equal(await text(page, 'plan-spec-steps'), String(info.speculative_num_steps));
    assert.equal(await text(page, 'launch-id'), String(info.launch_id));
    assert.equal(await text(page, 'model'), 'tiny-coder');
    // Live figures equal /metrics (the server is idle, so nothing moves between the reads).
    v = await metrics(srv.base);
    assert.equal(await text(page, 'running'), String(v('deltaserve_requests_running')));
    assert.equal(await text(page, 'waiting'), String(v('deltaserve_requests_waiting')));
    assert.equal(await text(page, 'kv-used'), String(v('deltaserve_kv_tokens_used')));
    assert.equal(await text(page, 'kv-total'), String(v('deltaserve_kv_tokens_total')));
    assert.equal(await text(page, 'kv-total'), String(info.max_total_num_tokens));
    assert.equal(await text(page, 'slots-total'), String(v('deltaserve_state_slots_total')));
    const generated = v('deltaserve_generation_tokens_total');
    assert.ok(generated >= 32, `bench generated ${generated} tokens`);
    assert.equal(await text(page, 'gen-tokens'), String(generated));
    assert.equal(await text(page, 'prompt-tokens'), String(v('deltaserve_prompt_tokens_total')));
    assert.equal(await text(page, 'gen-tps'), '0.0');  // idle between the two polls
    const accept = v('sglang:spec_accept_length');
    assert.ok(accept >= 1, `accept length ${accept}`);
    assert.equal(await text(page, 'accept-length'), accept.toFixed(2));

    // Recent launches: this one, marked current, with its measurement in the table and the plot.
    const row = page.locator(`#launches-body tr[data-launch="${info.launch_id}"]`);
    await row.waitFor({ timeout: 15000 });
    assert.equal(await row.getAttribute('class'), 'current');
    const cells = await row.locator('td').allTextContents();
    assert.equal(cells[0], String(info.launch_id));
    assert.equal(cells[2], 'running');
    assert.equal(cells[4], '512');
    assert.equal(cells[8], '1');  // one measurement (concurrency 1)
    const bar = page.locator(`#launches-plot rect[data-launch="${info.launch_id}"]`);
    const barValue = Number(await bar.getAttribute('data-value'));
    assert.ok(Math.abs(barValue - bestTps.levels[0].output_tokens_per_s) < 1e-6,
      `plot ${barValue} vs bench ${JSON.stringify(bestTps.levels[0])}`);
    assert.ok(Number(await bar.getAttribute('height')) > 0);
    assert.equal(cells[9], `${barValue.toFixed(1)} @1`);

    // The chat box: one message, a streamed reply, then the counters move on the page as well.
    await page.fill('#chat-input', 'Write a haiku about caches.');
    await page.click('#chat-send');
    await page.waitForFunction(() => /^(finish_reason|error)/.test(document.getElementById('chat-status').textContent),
      null, { timeout: 120000 });
    const status = await text(page, 'chat-status');
    assert.match(status, /^finish_reason: (stop|length) \(\d+ prompt \+ \d+ completion tokens\)$/);
    const completion = Number(status.match(/\+ (\d+) completion/)[1]);
    assert.ok(completion > 0);
    const reply = await page.locator('#chat-log .msg.assistant').last().textContent();
    assert.ok(reply.length > 0, 'empty reply');
    assert.equal(await page.locator('#chat-log .msg.user').last().textContent(), 'Write a haiku about caches.');
    v = await waitIdle(srv.base);
    assert.equal(v('deltaserve_generation_tokens_total'), generated + completion);
    await page.waitForFunction((want) => document.getElementById('gen-tokens').textContent === want,
      String(generated + completion), { timeout: 15000 });

    const shot = path.join(BUILD_DIR, 'status_page.png');
    await page.screenshot({ path: shot, fullPage: true });
    console.log(`status page screenshot: ${shot}`);
    t.diagnostic(`screenshot: ${shot}`);
    assert.deepEqual(consoleErrors, []);
  } finally {
    await page.close();
    await stopServer(srv);
  }
});

test('status page with --api-key: asks for the key, then shows the figures', async (t) => {
  if (!HAVE_CHROMIUM) { t.skip(`no Chromium at ${CHROMIUM} (apt-get install chromium)`); return; }
  const srv = await startServer(['--api-key', 'sekret-123']);
  const page = await browser.newPage();
  try {
    const resp = await page.goto(`${srv.base}/`);
    assert.equal(resp.status(), 200);  // the page itself needs no key
    await page.locator('#auth.shown').waitFor({ timeout: 15000 });
    assert.equal(await text(page, 'conn-state'), 'API key required');
    assert.equal(await text(page, 'plan-kv-tokens'), '-');  // nothing shown without the key
    await page.fill('#api-key', 'wrong');
    await page.click('#api-key-save');
    await page.waitForFunction(() => document.getElementById('conn-state').textContent === 'the API key was refused',
      null, { timeout: 15000 });
    await page.fill('#api-key', 'sekret-123');
    await page.click('#api-key-save');
    await page.waitForFunction(() => document.getElementById('plan-kv-tokens').textContent !== '-', null, { timeout: 15000 });
    const auth = { Authorization: 'Bearer sekret-123' };
    const info = await (await fetch(`${srv.base}/get_server_info`, { headers: auth })).json();
    assert.equal(await text(page, 'plan-kv-tokens'), String(info.max_total_num_tokens));
    assert.equal(await page.locator('#auth').getAttribute('class'), '');
    // The chat request carries the key too.
    await page.fill('#chat-input', 'hi');
    await page.click('#chat-send');
    await page.waitForFunction(() => /^(finish_reason|error)/.test(document.getElementById('chat-status').textContent),
      null, { timeout: 120000 });
    assert.match(await text(page, 'chat-status'), /^finish_reason: /);
  } finally {
    await page.close();
    await stopServer(srv);
  }
});
