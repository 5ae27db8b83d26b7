// End-to-end: start `deltaserve serve` on 127.0.0.1 (a port it picks) with models/tiny-coder and drive
// it with the official openai client and with curl. The binary comes from $DELTASERVE_BIN.
// The tiny model is not chat-trained: tests check protocol shape and invariants, not wording.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import { startServer as launchServer, stopServer } from './server.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../..');
const BIN = process.env.DELTASERVE_BIN ?? path.join(repo, 'build/src/app/deltaserve');
const MODEL = process.env.DELTASERVE_E2E_MODEL ?? path.join(repo, 'models/tiny-coder');
const CONTEXT = 512;

// Launch records go to a private state dir, never the user's ~/.local/state.
const STATE_DIR = fs.mkdtempSync(path.join(os.tmpdir(), 'ds-e2e-state-'));

// bare: only the address and state dir besides extraArgs (no capacity or parser flags).
function startServer(extraArgs = [], { bare = false } = {}) {
  const common = ['--state-dir', STATE_DIR];
  const args = bare ? [...common, ...extraArgs] : [...common, '--model-path', MODEL,
    '--context-length', String(CONTEXT), '--max-running-requests', '16', '--max-total-tokens', '65536',
    '--reasoning-parser', 'qwen3', '--tool-call-parser', 'qwen3_coder',
    '--served-model-name', 'tiny-coder', ...extraArgs];
  return launchServer(BIN, args);
}

function curl(args) {
  return new Promise((resolve) => {
    execFile('curl', ['-s', '-o', '-', '-w', '\n%{http_code}', ...args], { maxBuffer: 64 << 20 },
      (err, stdout) => {
        const nl = stdout.lastIndexOf('\n');
        resolve({ status: Number(stdout.slice(nl + 1)), body: stdout.slice(0, nl) });
      });
  });
}

async function metrics(base) {
  const r = await fetch(`${base}/metrics`);
  const text = await r.text();
  const value = (name) => {
    const m = text.match(new RegExp(`^${name} (\\S+)$`, 'm'));
    return m ? Number(m[1]) : NaN;
  };
  return { text, value };
}

async function waitIdle(base, timeoutMs = 20000) {
  const deadline = Date.now() + timeoutMs;
  let last;
  while (Date.now() < deadline) {
    last = await metrics(base);
    const busy = ['deltaserve_requests_running', 'deltaserve_requests_waiting',
      'deltaserve_kv_tokens_used', 'deltaserve_state_slots_used'].map(last.value);
    if (busy.every((v) => v === 0)) return last;
    await new Promise((r) => setTimeout(r, 50));
  }
  assert.fail(`gauges did not return to 0:\n${last.text}`);
}

let server;
let client;

before(async () => {
  server = await startServer();
  client = new OpenAI({ baseURL: `${server.base}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
});

after(async () => { await stopServer(server); });

test('models and health', async () => {
  const models = await client.models.list();
  assert.equal(models.data[0].id, 'tiny-coder');
  const h = await curl([`${server.base}/health`]);
  assert.equal(h.status, 200);
});

test('chat, non-streaming, usage with reasoning tokens', async () => {
  const r = await client.chat.completions.create({
    model: 'tiny-coder', messages: [{ role: 'user', content: 'Write a haiku.' }], max_tokens: 12,
    temperature: 0,
  });
  assert.equal(r.object, 'chat.completion');
  const c = r.choices[0];
  assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason));
  assert.equal(c.message.role, 'assistant');
  assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 12);
  assert.equal(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens);
  assert.equal(r.usage.reasoning_tokens, r.usage.completion_tokens_details.reasoning_tokens);
  assert.ok(r.usage.reasoning_tokens <= r.usage.completion_tokens);
  // Thinking on: the output starts in reasoning.
  if (!(c.message.content ?? '').length) assert.ok(typeof c.message.reasoning_content === 'string');
});

test('chat, thinking off: no reasoning', async () => {
  const r = await client.chat.completions.create({
    model: 'tiny-coder', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 8, temperature: 0,
    chat_template_kwargs: { enable_thinking: false },
  });
  assert.equal(r.usage.reasoning_tokens, 0);
  assert.equal(r.choices[0].message.reasoning_content ?? null, null);
  assert.equal(typeof r.choices[0].message.content, 'string');
});

test('chat, streaming with include_usage matches non-streaming (greedy)', async () => {
  const req = {
    model: 'tiny-coder', messages: [{ role: 'user', content: 'Count to five.' }], max_tokens: 16,
    temperature: 0, chat_template_kwargs: { enable_thinking: false },
  };
  const full = await client.chat.completions.create(req);
  const stream = await client.chat.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  let content = '';
  let finish = null;
  let usage = null;
  let first = true;
  for await (const chunk of stream) {
    assert.equal(chunk.object, 'chat.completion.chunk');
    if (chunk.usage) { usage = chunk.usage; assert.equal(chunk.choices.length, 0); continue; }
    const ch = chunk.choices[0];
    if (first) { assert.equal(ch.delta.role, 'assistant'); first = false; }
    content += ch.delta.content ?? '';
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(content, full.choices[0].message.content);
  assert.equal(finish, full.choices[0].finish_reason);
  assert.equal(usage.completion_tokens, full.usage.completion_tokens);
});

test('text completions, plain and streamed', async () => {
  const r = await client.completions.create({ model: 'tiny-coder', prompt: 'def fib(n):', max_tokens: 10, temperature: 0 });
  assert.equal(r.object, 'text_completion');
  assert.equal(typeof r.choices[0].text, 'string');
  const stream = await client.completions.create({ model: 'tiny-coder', prompt: 'def fib(n):', max_tokens: 10, temperature: 0, stream: true });
  let text = '';
  for await (const chunk of stream) text += chunk.choices[0]?.text ?? '';
  assert.equal(text, r.choices[0].text);
});

test('seeds: same seed, same sample; n > 1', async () => {
  const req = { model: 'tiny-coder', prompt: 'import numpy as', max_tokens: 12, temperature: 1.0, seed: 1234 };
  const a = await client.completions.create(req);
  const b = await client.completions.create(req);
  assert.equal(a.choices[0].text, b.choices[0].text);
  const n = await client.completions.create({ ...req, n: 3 });
  assert.equal(n.choices.length, 3);
  assert.deepEqual(n.choices.map((c) => c.index), [0, 1, 2]);
});

test('logprobs (chat and completions)', async () => {
  const r = await client.chat.completions.create({
    model: 'tiny-coder', messages: [{ role: 'user', content: 'x' }], max_tokens: 4, temperature: 0,
    logprobs: true, top_logprobs: 3,
  });
  const lp = r.choices[0].logprobs.content;
  assert.equal(lp.length, r.usage.completion_tokens);
  for (const t of lp) {
    assert.equal(typeof t.token, 'string');
    assert.ok(t.logprob <= 0);
    assert.equal(t.top_logprobs.length, 3);
  }
  const c = await client.completions.create({ model: 'tiny-coder', prompt: 'a', max_tokens: 3, temperature: 0, logprobs: 2 });
  assert.equal(c.choices[0].logprobs.tokens.length, c.usage.completion_tokens);
  assert.equal(Object.keys(c.choices[0].logprobs.top_logprobs[0]).length, 2);
});

test('stop strings end the text before the match', async () => {
  const req = { model: 'tiny-coder', prompt: 'for i in range(10):', max_tokens: 40, temperature: 0, ignore_eos: true };
  const full = (await client.completions.create(req)).choices[0].text;
  if (full.length < 8) return;  // nothing to cut
  const stop = full.slice(4, 7);
  const cut = full.indexOf(stop);
  const r = await client.completions.create({ ...req, stop: [stop] });
  assert.equal(r.choices[0].text, full.slice(0, cut));
  assert.equal(r.choices[0].finish_reason, 'stop');
});

test('completions: batched prompts x n=2, indices, usage sums, echo (plain and streamed)', async () => {
  const prompts = ['def add(a, b):', 'import os\n'];
  // Each prompt's own token count, from single requests.
  const single = await Promise.all(prompts.map((p) => client.completions.create({
    model: 'tiny-coder', prompt: p, max_tokens: 1, temperature: 0 })));
  const promptTokens = single.reduce((a, r) => a + r.usage.prompt_tokens, 0);
  const req = { model: 'tiny-coder', prompt: prompts, n: 2, max_tokens: 5, temperature: 0,
    ignore_eos: true, echo: true };
  const r = await client.completions.create(req);
  assert.equal(r.choices.length, 4);
  assert.deepEqual(r.choices.map((c) => c.index), [0, 1, 2, 3]);
  for (const c of r.choices) {
    assert.ok(c.text.startsWith(prompts[c.index >> 1]), `choice ${c.index}: ${JSON.stringify(c.text)}`);
    assert.equal(c.finish_reason, 'length');
    assert.ok('matched_stop' in c);
    assert.equal(c.matched_stop, null);
  }
  assert.equal(r.usage.prompt_tokens, promptTokens);  // each prompt once, not n times
  assert.equal(r.usage.completion_tokens, 4 * 5);
  assert.equal(r.usage.total_tokens, promptTokens + 20);

  const stream = await client.completions.create({ ...req, stream: true, stream_options: { include_usage: true } });
  const text = ['', '', '', ''];
  const finish = [null, null, null, null];
  let usage = null;
  for await (const chunk of stream) {
    if (chunk.usage && chunk.choices.length === 0) { usage = chunk.usage; continue; }
    for (const c of chunk.choices) {
      assert.equal(finish[c.index], null, `text after the finish of choice ${c.index}`);
      text[c.index] += c.text;
      if (c.finish_reason) { finish[c.index] = c.finish_reason; assert.equal(c.matched_stop, null); }
    }
  }
  for (let i = 0; i < 4; i++) {
    assert.ok(text[i].startsWith(prompts[i >> 1]), `streamed choice ${i}: ${JSON.stringify(text[i])}`);
    assert.ok(text[i].length > prompts[i >> 1].length);
    assert.equal(finish[i], 'length');
  }
  assert.equal(usage.prompt_tokens, promptTokens);
  assert.equal(usage.completion_tokens, 20);
  // Token-id prompts: the same shape.
  const ids = await client.completions.create({ model: 'tiny-coder', prompt: [[1, 2, 3], [4, 5]], max_tokens: 2,
    temperature: 0, ignore_eos: true });
  assert.deepEqual(ids.choices.map((c) => c.index), [0, 1]);
  assert.equal(ids.usage.prompt_tokens, 5);
  assert.equal(ids.usage.completion_tokens, 4);
  await waitIdle(server.base);
});

test('matched_stop: the stop string, an EOS id, null at length', async () => {
  const req = { model: 'tiny-coder', prompt: 'for i in range(10):', max_tokens: 8, temperature: 0, ignore_eos: true };
  const full = (await client.completions.create(req)).choices[0];
  assert.equal(full.finish_reason, 'length');
  assert.equal(full.matched_stop, null);
  if (full.text.length >= 6) {
    const stop = full.text.slice(3, 6);
    const r = await client.completions.create({ ...req, stop: ['never-there', stop] });
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].matched_stop, stop);
    const s = await client.completions.create({ ...req, stop: [stop], stream: true });
    let last = null;
    for await (const chunk of s) for (const c of chunk.choices) if (c.finish_reason) last = c;
    assert.equal(last.finish_reason, 'stop');
    assert.equal(last.matched_stop, stop);
  }
  // A stop_token_ids entry: the token id. Take the second greedy token and stop on it.
  const probe = await client.completions.create({ model: 'tiny-coder', prompt: 'def add(a, b):', max_tokens: 3,
    temperature: 0, ignore_eos: true, logprobs: 0 });
  const toks = probe.choices[0].logprobs.tokens;
  const tokenized = await new Promise((resolve) => execFile(BIN, ['tokenize', '--model', MODEL, '--text', toks[1]],
    (err, stdout) => resolve(err ? null : JSON.parse(stdout))));
  if (tokenized && tokenized.ids.length === 1 && toks[0] !== toks[1]) {
    const id = tokenized.ids[0];
    const r = await client.completions.create({ model: 'tiny-coder', prompt: 'def add(a, b):', max_tokens: 3,
      temperature: 0, ignore_eos: true, stop_token_ids: [id] });
    assert.equal(r.choices[0].finish_reason, 'stop');
    assert.equal(r.choices[0].matched_stop, id);
    assert.equal(r.usage.completion_tokens, 2);
  }
  // A chat that ends by itself reports the EOS token id that ended it.
  const chat = await client.chat.completions.create({
    model: 'tiny-coder', messages: [{ role: 'user', content: 'Hi' }], max_tokens: 8, temperature: 0,
    chat_template_kwargs: { enable_thinking: false },
  });
  const c = chat.choices[0];
  if (c.finish_reason === 'stop') assert.ok([8183, 8185].includes(c.matched_stop), JSON.stringify(c));
  else assert.equal(c.matched_stop, null);
});

test('reasoning options: include_reasoning=false, stream_reasoning=false', async () => {
  const req = { model: 'tiny-coder', messages: [{ role: 'user', content: 'Why is the sky blue?' }], max_tokens: 8,
    temperature: 0 };
  const dropped = await client.chat.completions.create({ ...req, include_reasoning: false });
  assert.ok(!('reasoning_content' in dropped.choices[0].message), JSON.stringify(dropped.choices[0]));
  assert.equal(typeof dropped.choices[0].message.content, 'string');
  // Thinking is on: the reasoning was generated and is still counted.
  assert.ok(dropped.usage.reasoning_tokens > 0);

  const collect = async (extra) => {
    const s = await client.chat.completions.create({ ...req, ...extra, stream: true });
    let reasoning = '';
    let chunks = 0;
    let content = '';
    for await (const chunk of s) {
      const d = chunk.choices[0]?.delta ?? {};
      if (d.reasoning_content) { chunks++; reasoning += d.reasoning_content; }
      if (d.content) content += d.content;
    }
    return { reasoning, chunks, content };
  };
  const streamed = await collect({});
  const held = await collect({ stream_reasoning: false });
  assert.ok(streamed.reasoning.length > 0);
  assert.ok(streamed.chunks > 1);
  assert.equal(held.chunks, 1);  // sent once, when the reasoning ends (here: the end of the stream)
  assert.equal(held.reasoning, streamed.reasoning);
  assert.equal(held.content, streamed.content);
  const none = await collect({ include_reasoning: false });
  assert.equal(none.chunks, 0);
  assert.equal(none.content, streamed.content);
});

test('batched prompts and reasoning options: validation errors', async () => {
  const post = (route, body) => curl(['-X', 'POST', '-H', 'Content-Type: application/json', '--data-binary',
    JSON.stringify(body), `${server.base}${route}`]);
  const expectError = async (route, body, param, text) => {
    const r = await post(route, body);
    assert.equal(r.status, 400, r.body);
    const e = JSON.parse(r.body).error;
    assert.equal(e.param, param, r.body);
    if (text) assert.ok(e.message.includes(text), r.body);
  };
  const long = 'word '.repeat(CONTEXT * 2);
  await expectError('/v1/completions', { prompt: ['fine', ''] }, 'prompt', 'prompt[1]');
  await expectError('/v1/completions', { prompt: ['fine', long] }, 'prompt', 'prompt[1]');
  await expectError('/v1/completions', { prompt: ['a', 'word '.repeat(100)], max_tokens: CONTEXT - 10 }, 'max_tokens', 'prompt[1]');
  await expectError('/v1/completions', { prompt: ['a', [1, 2]] }, 'prompt', 'prompt[1]');
  await expectError('/v1/completions', { prompt: [] }, 'prompt');
  await expectError('/v1/completions', { prompt: Array(100).fill('x'), n: 3 }, 'n');
  await expectError('/v1/completions', { prompt: Array(300).fill('x') }, 'prompt');
  const msgs = [{ role: 'user', content: 'hi' }];
  await expectError('/v1/chat/completions', { messages: msgs, include_reasoning: 'no' }, 'include_reasoning');
  await expectError('/v1/chat/completions', { messages: msgs, stream_reasoning: 1 }, 'stream_reasoning');
  await waitIdle(server.base);
});

test('tools: request with tools is served; parsed shape is OpenAI', async () => {
  const r = await client.chat.completions.create({
    model: 'tiny-coder', messages: [{ role: 'user', content: 'weather in Paris?' }], max_tokens: 16,
    temperature: 0,
    tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object', properties: { city: { type: 'string' } } } } }],
  });
  const c = r.choices[0];
  assert.ok(['stop', 'length', 'tool_calls'].includes(c.finish_reason));
  for (const tc of c.message.tool_calls ?? []) {
    assert.equal(tc.type, 'function');
    JSON.parse(tc.function.arguments);
  }
});

test('cancellation: aborting a stream frees the engine', async () => {
  const controller = new AbortController();
  const stream = await client.chat.completions.create({
    model: 'tiny-coder', messages: [{ role: 'user', content: 'Tell a long story.' }], max_tokens: 400,
    stream: true, ignore_eos: true,
  }, { signal: controller.signal });
  let got = 0;
  try {
    // The client swallows its own AbortError and ends the iteration.
    for await (const _ of stream) { if (++got === 3) controller.abort(); }
  } catch (e) {
    assert.equal(e.name, 'AbortError');
  }
  assert.ok(got < 50, `stream went on after abort (${got} chunks)`);
  const m = await waitIdle(server.base);
  assert.match(m.text, /deltaserve_requests_abandoned_total [1-9]/);
});

test('64 concurrent streams, half abandoned, gauges back to 0', async () => {
  const jobs = [];
  for (let i = 0; i < 64; i++) {
    jobs.push((async () => {
      const controller = new AbortController();
      const stream = await client.completions.create({
        model: 'tiny-coder', prompt: `# task ${i}\n`, max_tokens: i % 2 ? 200 : 16, stream: true,
        ignore_eos: true,
      }, { signal: controller.signal });
      let n = 0;
      try {
        for await (const _ of stream) { if (i % 2 && ++n === 2) controller.abort(); }
        return i % 2 ? 'aborted-late' : 'done';
      } catch { return 'aborted'; }
    })());
  }
  const results = await Promise.all(jobs);
  assert.equal(results.filter((r) => r === 'done').length, 32);
  const m = await waitIdle(server.base);
  assert.ok(m.value('deltaserve_generation_tokens_total') > 0);
  assert.match(m.text, /deltaserve_time_to_first_token_seconds_count [1-9]/);
  assert.match(m.text, /deltaserve_inter_token_latency_seconds_count [1-9]/);
});

test('errors: OpenAI error bodies with the right status', async () => {
  const url = `${server.base}/v1/chat/completions`;
  const post = (body, extra = []) => curl(['-X', 'POST', '-H', 'Content-Type: application/json', ...extra, '--data-binary', body, url]);
  const expectError = async (p, status, param) => {
    const r = await p;
    assert.equal(r.status, status, r.body);
    const e = JSON.parse(r.body).error;
    for (const k of ['message', 'type', 'param', 'code']) assert.ok(k in e, r.body);
    if (param !== undefined) assert.equal(e.param, param, r.body);
  };
  const msgs = '"messages":[{"role":"user","content":"hi"}]';
  await expectError(post('{"messages": ['), 400);
  await expectError(post(`{${msgs},"temperature":-1}`), 400, 'temperature');
  await expectError(post(`{${msgs},"temperature":NaN}`), 400);
  await expectError(post('{"messages":[{"role":"wizard","content":"hi"}]}'), 400, 'messages[0].role');
  await expectError(post(`{${msgs},"max_tokens":${CONTEXT * 4}}`), 400, 'max_tokens');
  await expectError(post(`{"messages":[{"role":"user","content":"${'word '.repeat(CONTEXT * 2)}"}]}`), 400, 'messages');
  // Invalid UTF-8 inside a JSON string: raw bytes from a file (argv would re-encode them).
  const badFile = path.join(os.tmpdir(), `ds-e2e-bad-${process.pid}.json`);
  fs.writeFileSync(badFile, Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'),
    Buffer.from([0xff, 0xfe, 0xc3]), Buffer.from('"}]}')]));
  await expectError(post(`@${badFile}`), 400);
  fs.unlinkSync(badFile);
  // Nesting far deeper than any real request.
  fs.writeFileSync(badFile, '['.repeat(100000) + ']'.repeat(100000));
  await expectError(post(`@${badFile}`), 400);
  fs.unlinkSync(badFile);
  await expectError(curl([`${server.base}/v1/nothing`]), 404);
  // Over --max-request-bytes (32 MiB default).
  const big = `{"messages":[{"role":"user","content":"${'a'.repeat(33 << 20)}"}]}`;
  const file = path.join(os.tmpdir(), `ds-e2e-big-${process.pid}.json`);
  fs.writeFileSync(file, big);
  await expectError(curl(['-X', 'POST', '-H', 'Content-Type: application/json', '--data-binary', `@${file}`, url]), 413);
  fs.unlinkSync(file);
  // The openai client raises BadRequestError for 400.
  await assert.rejects(client.chat.completions.create({ model: 'tiny-coder', messages: [{ role: 'user', content: 'x' }], temperature: -2 }),
    (e) => e.status === 400);
  await waitIdle(server.base);
});

test('api key: 401 without a valid token; health open', async () => {
  const keyed = await startServer(['--api-key', 'sekret']);
  try {
    const noKey = new OpenAI({ baseURL: `${keyed.base}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(noKey.models.list(), (e) => e.status === 401);
    const withKey = new OpenAI({ baseURL: `${keyed.base}/v1`, apiKey: 'sekret', maxRetries: 0 });
    assert.equal((await withKey.models.list()).data.length, 1);
    assert.equal((await curl([`${keyed.base}/health`])).status, 200);
    assert.equal((await curl([`${keyed.base}/v1/models`])).status, 401);
  } finally {
    await stopServer(keyed);
  }
});

// The prefix cache: a repeated prompt is served mostly from cache, and usage says how much (the
// OpenAI field), streamed or not; /flush_cache empties it when idle.
test('prefix cache: usage.prompt_tokens_details.cached_tokens, streaming too; /flush_cache', async () => {
  const prompt = 'def add(a, b):\n    return a + b\n\n'.repeat(12);
  const first = await client.completions.create({ model: 'tiny-coder', prompt, max_tokens: 4, temperature: 0 });
  assert.equal(first.usage.prompt_tokens_details.cached_tokens, 0);
  const again = await client.completions.create({ model: 'tiny-coder', prompt, max_tokens: 4, temperature: 0 });
  assert.equal(again.choices[0].text, first.choices[0].text);
  const cached = again.usage.prompt_tokens_details.cached_tokens;
  assert.ok(cached > 0 && cached < again.usage.prompt_tokens, JSON.stringify(again.usage));
  const stream = await client.chat.completions.create({ model: 'tiny-coder', messages: [{ role: 'user', content: prompt }],
    max_tokens: 4, temperature: 0, stream: true, stream_options: { include_usage: true } });
  let usage;
  for await (const chunk of stream) if (chunk.usage) usage = chunk.usage;
  assert.ok(usage && usage.prompt_tokens_details && usage.prompt_tokens_details.cached_tokens >= 0, JSON.stringify(usage));
  const chat = await client.chat.completions.create({ model: 'tiny-coder', messages: [{ role: 'user', content: prompt }],
    max_tokens: 4, temperature: 0 });
  assert.ok(chat.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(chat.usage));
  await waitIdle(server.base);
  const flushed = await curl(['-X', 'POST', `${server.base}/flush_cache`]);
  assert.equal(flushed.status, 200, flushed.body);
  const m = await metrics(server.base);
  assert.ok(m.value('deltaserve_prompt_tokens_cached_total') > 0, m.text);
  assert.equal(m.value('deltaserve_prefix_cache_blocks'), 0, 'flushed');
  const after = await client.completions.create({ model: 'tiny-coder', prompt, max_tokens: 4, temperature: 0 });
  assert.equal(after.usage.prompt_tokens_details.cached_tokens, 0, 'flushed');
});

// cache_salt (vLLM) and extra_key (SGLang): cached prefixes are shared only within one namespace.
test('prefix cache: cache_salt and extra_key keep cached prefixes apart', async () => {
  const prompt = 'class Stack:\n    def push(self, x):\n        self.items.append(x)\n\n'.repeat(8);
  const ask = (extra) => client.completions.create({ model: 'tiny-coder', prompt, max_tokens: 2, temperature: 0, ...extra });
  const cachedOf = (r) => r.usage.prompt_tokens_details.cached_tokens;
  assert.equal(cachedOf(await ask({ cache_salt: 'tenant-A' })), 0);
  assert.ok(cachedOf(await ask({ cache_salt: 'tenant-A' })) > 0, 'same salt: served from cache');
  assert.equal(cachedOf(await ask({ cache_salt: 'tenant-B' })), 0, 'another salt: not');
  assert.equal(cachedOf(await ask({})), 0, 'no salt: not');
  assert.equal(cachedOf(await ask({ extra_key: 'k1' })), 0, 'an extra_key is a namespace too');
  assert.ok(cachedOf(await ask({ extra_key: 'k1' })) > 0);
  assert.equal(cachedOf(await ask({ extra_key: 'k1', cache_salt: 'tenant-A' })), 0, 'both together: their own');
  const empty = await curl(['-s', '-H', 'content-type: application/json', '-d',
    JSON.stringify({ model: 'tiny-coder', prompt: 'x', max_tokens: 1, cache_salt: '' }), `${server.base}/v1/completions`]);
  assert.equal(empty.status, 400, empty.body);
  assert.equal(JSON.parse(empty.body).error.param, 'cache_salt');
});

// deltaserve bench --multi-turn: each turn resends the conversation; the cache serves the history.
test('bench --multi-turn: later turns are served from the prefix cache', async () => {
  const srv = await startServer(['--model-path', MODEL, '--context-length', '4096', '--max-running-requests', '4'],
    { bare: true });
  const out = path.join(STATE_DIR, 'multiturn.json');
  let r;
  try {
    r = await new Promise((resolve) => execFile(BIN, ['bench', '--multi-turn', '--url', srv.base,
      '--conversations', '2', '--turns', '4', '--system-len', '300', '--turn-len', '40', '--output-len', '8',
      '--output', out], { timeout: 120000 }, (err, stdout, stderr) => resolve({ err, stdout, stderr })));
  } finally {
    await stopServer(srv);
  }
  assert.equal(r.err, null, r.stderr + r.stdout);
  const j = JSON.parse(fs.readFileSync(out, 'utf8'));
  assert.equal(j.turns.length, 4);
  assert.equal(j.turns[0].cached_tokens, 0, JSON.stringify(j.turns[0]));
  for (const t of j.turns.slice(1)) {
    assert.equal(t.failed, 0);
    assert.ok(t.cached_tokens > 0.7 * t.prompt_tokens, JSON.stringify(t));
  }
  assert.ok(j.hit_ratio > 0.5 && j.hit_ratio < 1, String(j.hit_ratio));
});

// One memory model: what serve allocated (/get_server_info) is what `plan` prints for the same flags.
test('get_server_info equals plan for the same flags (CPU, --max-memory 1GiB)', async () => {
  const flags = ['--model-path', MODEL, '--device', 'cpu', '--max-memory', '1GiB',
    '--speculative-algorithm', 'NEXTN', '--speculative-num-steps', '3'];
  const srv = await startServer(flags, { bare: true });
  try {
    const info = JSON.parse((await curl([`${srv.base}/get_server_info`])).body);
    const plan = await new Promise((resolve) => execFile(BIN, ['plan', '--json', ...flags],
      (err, stdout, stderr) => resolve({ err, stdout, stderr })));
    assert.equal(plan.err, null, plan.stderr);
    const p = JSON.parse(plan.stdout);
    for (const key of ['max_total_num_tokens', 'max_running_requests', 'max_mamba_cache_size', 'kv_cache_dtype',
      'context_length']) {
      assert.equal(info[key], p[key], `${key}: server ${info[key]}, plan ${p[key]}`);
    }
    assert.ok(info.max_total_num_tokens > 0 && info.max_running_requests > 0 && info.max_mamba_cache_size > 0);
    // Stop 54: the arguments as JSON types, as SGLang's server_args (every value was a string,
    // and "false" reads as true in Python); "auto" is null.
    assert.strictEqual(info.disable_radix_cache, false);
    assert.strictEqual(typeof info.port, 'number');
    assert.strictEqual(info.chunked_prefill_size, null);
    assert.strictEqual(typeof info.mem_fraction_static === 'number' || info.mem_fraction_static === null, true);
    assert.strictEqual(typeof info.model_path, 'string');
    // /v1/server_info carries the same figures.
    const v1 = JSON.parse((await curl([`${srv.base}/v1/server_info`])).body);
    assert.equal(v1.max_total_num_tokens, info.max_total_num_tokens);
  } finally {
    await stopServer(srv);
  }
});

test('serve -> bench -> history: the measurement lands on the launch that served it', async () => {
  const srv = await startServer(['--speculative-algorithm', 'NEXTN', '--speculative-num-steps', '3']);
  try {
    const info = JSON.parse((await curl([`${srv.base}/v1/server_info`])).body);
    assert.ok(info.launch_id > 0, `server_info: ${JSON.stringify(info)}`);
    assert.equal(info.speculative_num_steps, 3);
    const outJson = path.join(STATE_DIR, 'bench.json');
    const bench = await new Promise((resolve) => execFile(BIN, ['bench', '--url', srv.base, '--concurrency', '1,2',
      '--num-prompts', '4', '--input-len', '16', '--output-len', '16', '--state-dir', STATE_DIR, '--output', outJson],
      { timeout: 120000 }, (err, stdout, stderr) => resolve({ err, stdout, stderr })));
    assert.equal(bench.err, null, bench.stderr);
    const report = JSON.parse(fs.readFileSync(outJson, 'utf8'));
    assert.equal(report.launch_id, info.launch_id);
    const hist = await new Promise((resolve) => execFile(BIN, ['history', '--json', '--state-dir', STATE_DIR],
      (err, stdout, stderr) => resolve({ err, stdout, stderr })));
    assert.equal(hist.err, null, hist.stderr);
    const launch = JSON.parse(hist.stdout).find((l) => l.launch_id === info.launch_id);
    assert.ok(launch, hist.stdout);
    assert.ok(launch.best_output_tokens_per_s > 0, JSON.stringify(launch));
    assert.ok(launch.measurements >= 2);
  } finally {
    await stopServer(srv);
  }
});
