// End-to-end structured output: `deltaserve serve` with models/tiny-coder, sampling at
// temperature 1, driven by the official openai client. Every JSON output is validated against its
// schema by ajv (an independent validator), forced tool calls' arguments against the tool's
// parameters; SGLang's regex / ebnf fields, /generate as bench_serving calls it, and the
// Responses API are covered too.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import OpenAI from 'openai';
import Ajv from 'ajv/dist/2020.js';
import addFormats from 'ajv-formats';
import { startServer, stopServer } from './server.mjs';

const here = path.dirname(fileURLToPath(import.meta.url));
const repo = path.resolve(here, '../..');
const BIN = process.env.DELTASERVE_BIN ?? path.join(repo, 'build/src/app/deltaserve');
const MODEL = process.env.DELTASERVE_E2E_MODEL ?? path.join(repo, 'models/tiny-coder');
const STATE_DIR = fs.mkdtempSync(path.join(os.tmpdir(), 'ds-e2e-structured-'));

let server;
let client;
let base;

before(async () => {
  server = await startServer(BIN, ['--state-dir', STATE_DIR,
    '--model-path', MODEL, '--context-length', '1024', '--max-running-requests', '16',
    '--max-total-tokens', '65536', '--reasoning-parser', 'qwen3', '--tool-call-parser', 'qwen3_coder',
    '--served-model-name', 'tiny-coder']);
  base = server.base;
  client = new OpenAI({ baseURL: `${base}/v1`, apiKey: 'none', maxRetries: 0, timeout: 300000 });
});

after(() => stopServer(server));

const ajv = new Ajv({ strict: false, allErrors: true });
addFormats(ajv);

const str = (n) => ({ type: 'string', maxLength: n });
const int = (lo, hi) => ({ type: 'integer', minimum: lo, maximum: hi });
const obj = (properties, required = Object.keys(properties)) => ({ type: 'object', properties, required });

// 34 schemas: types, nesting, enums, arrays, $ref/$defs, recursion, anyOf/oneOf, formats,
// patterns, bounds. Strings are mostly bounded so that a 12M-parameter model sampling at
// temperature 1 reaches the end; two are not.
const SCHEMAS = {
  person: obj({ name: str(10), age: int(0, 120) }),
  color: { enum: ['red', 'green', 'blue'] },
  int_list: { type: 'array', items: int(-9, 9), minItems: 1, maxItems: 4 },
  address: obj({ street: str(12), zip: { type: 'string', pattern: '^[0-9]{5}$' } }),
  flags: obj({ on: { type: 'boolean' }, off: { type: 'boolean' } }),
  nullable: obj({ nick: { type: ['string', 'null'], maxLength: 6 } }),
  any_of: obj({ v: { anyOf: [int(0, 9), str(3)] } }),
  one_of: obj({ v: { oneOf: [{ const: 'a' }, { const: 'b' }] } }),
  refs: {
    $defs: { pt: obj({ x: int(-5, 5), y: int(-5, 5) }) },
    type: 'object', properties: { a: { $ref: '#/$defs/pt' }, path: { type: 'array', items: { $ref: '#/$defs/pt' }, maxItems: 3 } },
    required: ['a', 'path'],
  },
  linked_list: {
    $defs: { node: { type: 'object', properties: { v: int(0, 9), next: { anyOf: [{ $ref: '#/$defs/node' }, { type: 'null' }] } }, required: ['v', 'next'] } },
    $ref: '#/$defs/node',
  },
  date: obj({ d: { type: 'string', format: 'date' } }),
  uuid: obj({ id: { type: 'string', format: 'uuid' } }),
  email: obj({ mail: { type: 'string', format: 'email' } }),
  date_time: obj({ at: { type: 'string', format: 'date-time' } }),
  ipv4: obj({ ip: { type: 'string', format: 'ipv4' } }),
  unit_number: obj({ p: { type: 'number', minimum: 0, maximum: 1 } }),
  exclusive: obj({ n: { type: 'integer', exclusiveMinimum: 0, exclusiveMaximum: 100 } }),
  tags: obj({ tags: { type: 'array', items: { enum: ['x', 'y', 'z'] }, maxItems: 5 } }),
  tuple: { type: 'array', prefixItems: [str(5), int(0, 9)], items: false },
  map: { type: 'object', additionalProperties: { type: 'boolean' }, maxProperties: 3 },
  constant: obj({ kind: { const: 'point' }, n: int(0, 3) }),
  optional: { type: 'object', properties: { a: int(0, 9), b: { type: 'boolean' }, c: str(4) } },
  lengths: obj({ s: { type: 'string', minLength: 2, maxLength: 5 } }),
  pattern: obj({ code: { type: 'string', pattern: '^[A-Z]{3}-[0-9]{2}$' } }),
  todos: { type: 'array', items: obj({ id: int(1, 99), done: { type: 'boolean' } }), maxItems: 3 },
  deep: obj({ a: obj({ b: obj({ c: obj({ d: int(0, 9) }) }) }) }),
  type_list: obj({ v: { type: ['integer', 'boolean'], minimum: 0, maximum: 9 } }),
  all_of: { allOf: [obj({ q: int(1, 5) })] },
  negative: obj({ t: int(-50, -1) }),
  open_interval: obj({ r: { type: 'number', exclusiveMinimum: -1, exclusiveMaximum: 1 } }),
  hostname: obj({ host: { type: 'string', format: 'hostname' } }),
  record: obj({ id: int(1, 999), name: str(8), ok: { type: 'boolean' }, score: { type: 'number', minimum: 0, maximum: 10 },
    tier: { enum: ['free', 'pro'] }, tags: { type: 'array', items: str(4), maxItems: 2 }, parent: { type: ['integer', 'null'], minimum: 0, maximum: 9 },
    note: str(6) }),
  unicode_enum: obj({ w: { enum: ['a b', 'é', '中'] } }),
  time: obj({ t: { type: 'string', format: 'time' } }),
  free_text: obj({ title: { type: 'string' } }),
  free_list: { type: 'array', items: { type: 'string' }, maxItems: 2 },
};

// At most `limit` requests in flight (the server batches them).
async function pool(items, limit, fn) {
  const out = new Array(items.length);
  let next = 0;
  async function worker() {
    while (next < items.length) {
      const i = next++;
      out[i] = await fn(items[i], i);
    }
  }
  await Promise.all(Array.from({ length: limit }, worker));
  return out;
}

test('response_format json_schema: 36 schemas at temperature 1, every output valid (ajv)', async () => {
  const names = Object.keys(SCHEMAS);
  assert.ok(names.length >= 30);
  const results = await pool(names, 8, async (name, i) => {
    const schema = SCHEMAS[name];
    const r = await client.chat.completions.create({
      model: 'tiny-coder',
      messages: [{ role: 'user', content: `Give me a ${name} as JSON.` }],
      response_format: { type: 'json_schema', json_schema: { name, schema } },
      temperature: 1,
      seed: 1000 + i,
      // Recursive schemas (linked_list) nest to a random depth at temperature 1: room for deep ones.
      max_tokens: 1000,
      chat_template_kwargs: { enable_thinking: false },
    });
    return { name, schema, choice: r.choices[0] };
  });
  const failures = [];
  for (const { name, schema, choice } of results) {
    const text = choice.message.content;
    if (choice.finish_reason !== 'stop') {
      failures.push(`${name}: finish_reason ${choice.finish_reason} after ${JSON.stringify(text).slice(0, 200)}`);
      continue;
    }
    let value;
    try {
      value = JSON.parse(text);
    } catch (e) {
      failures.push(`${name}: not JSON: ${JSON.stringify(text)}`);
      continue;
    }
    const validate = ajv.compile(schema);
    if (!validate(value)) failures.push(`${name}: ${JSON.stringify(text)} fails ${ajv.errorsText(validate.errors)}`);
  }
  assert.deepEqual(failures, []);
});

test('response_format json_object and thinking: the JSON comes after </think>', async () => {
  const r = await client.chat.completions.create({
    model: 'tiny-coder',
    messages: [{ role: 'user', content: 'An object, please.' }],
    response_format: { type: 'json_object' },
    temperature: 1, seed: 7, max_tokens: 400,
    chat_template_kwargs: { enable_thinking: false },
  });
  const c = r.choices[0];
  if (c.finish_reason === 'stop') {
    const v = JSON.parse(c.message.content);
    assert.equal(typeof v, 'object');
    assert.ok(!Array.isArray(v) && v !== null);
  } else {
    assert.equal(c.finish_reason, 'length');
    assert.ok(c.message.content.trimStart().startsWith('{'), c.message.content);
  }
  // A bad response_format type is a 400 that names the field.
  await assert.rejects(
    client.chat.completions.create({ model: 'tiny-coder', messages: [{ role: 'user', content: 'x' }], response_format: { type: 'bogus' } }),
    (e) => e.status === 400 && e.error?.param === 'response_format.type');
  await assert.rejects(
    client.chat.completions.create({ model: 'tiny-coder', messages: [{ role: 'user', content: 'x' }],
      response_format: { type: 'json_schema', json_schema: { name: 'n', schema: { type: 'array', uniqueItems: true } } } }),
    (e) => e.status === 400 && /uniqueItems/.test(e.message));
});

test('SGLang regex and ebnf fields through the openai client (extra body fields)', async () => {
  const r1 = await client.completions.create({ model: 'tiny-coder', prompt: 'x = ', regex: '[0-9]{3}-[a-z]{2}', temperature: 1, seed: 3, max_tokens: 20 });
  assert.match(r1.choices[0].text, /^[0-9]{3}-[a-z]{2}$/);
  assert.equal(r1.choices[0].finish_reason, 'stop');
  const r2 = await client.completions.create({ model: 'tiny-coder', prompt: 'ok? ', ebnf: 'root ::= ("yes" | "no") ("!" | ".")', temperature: 1, seed: 4, max_tokens: 10 });
  assert.match(r2.choices[0].text, /^(yes|no)[!.]$/);
  // /v1/completions without max_tokens stops at 16.
  const r3 = await client.completions.create({ model: 'tiny-coder', prompt: 'def f(', temperature: 1, seed: 5, ignore_eos: true });
  assert.equal(r3.usage.completion_tokens, 16);
});

const TOOLS = [
  { type: 'function', function: { name: 'get_weather', description: 'Weather for a city', parameters: {
    type: 'object', properties: { city: { type: 'string', maxLength: 12 }, days: { type: 'integer', minimum: 1, maximum: 7 },
      unit: { type: 'string', enum: ['C', 'F'] } }, required: ['city', 'days'] } } },
  { type: 'function', function: { name: 'add', parameters: {
    type: 'object', properties: { a: { type: 'number', minimum: -100, maximum: 100 }, b: { type: 'number', minimum: -100, maximum: 100 } }, required: ['a', 'b'] } } },
];

test('tool_choice required and named: calls parse, arguments valid under the tool schema', async () => {
  const validators = Object.fromEntries(TOOLS.map((t) => [t.function.name, ajv.compile(t.function.parameters)]));
  for (const seed of [11, 12, 13]) {
    const r = await client.chat.completions.create({
      model: 'tiny-coder', messages: [{ role: 'user', content: 'Weather in Paris?' }], tools: TOOLS,
      tool_choice: 'required', parallel_tool_calls: false, temperature: 1, seed, max_tokens: 300,
      chat_template_kwargs: { enable_thinking: false },
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c));
    assert.equal(c.message.tool_calls.length, 1);
    const call = c.message.tool_calls[0];
    assert.ok(validators[call.function.name], call.function.name);
    const args = JSON.parse(call.function.arguments);
    assert.ok(validators[call.function.name](args), `${call.function.arguments}: ${ajv.errorsText(validators[call.function.name].errors)}`);
  }
  const named = await client.chat.completions.create({
    model: 'tiny-coder', messages: [{ role: 'user', content: 'Add 2 and 3.' }], tools: TOOLS,
    tool_choice: { type: 'function', function: { name: 'add' } }, temperature: 1, seed: 21, max_tokens: 300,
    chat_template_kwargs: { enable_thinking: false },
  });
  const call = named.choices[0].message.tool_calls[0];
  assert.equal(call.function.name, 'add');
  assert.ok(validators.add(JSON.parse(call.function.arguments)), call.function.arguments);
  // Streaming: the same forced call arrives as tool_call deltas.
  const stream = await client.chat.completions.create({
    model: 'tiny-coder', messages: [{ role: 'user', content: 'Weather?' }], tools: TOOLS, tool_choice: 'required',
    parallel_tool_calls: false, temperature: 1, seed: 31, max_tokens: 300, stream: true,
    chat_template_kwargs: { enable_thinking: false },
  });
  let name = '';
  let argText = '';
  let finish = null;
  for await (const chunk of stream) {
    const ch = chunk.choices[0];
    if (!ch) continue;
    for (const tc of ch.delta?.tool_calls ?? []) {
      if (tc.index !== 0) continue;
      if (tc.function?.name) name = tc.function.name;
      argText += tc.function?.arguments ?? '';
    }
    if (ch.finish_reason) finish = ch.finish_reason;
  }
  assert.equal(finish, 'tool_calls');
  assert.ok(validators[name](JSON.parse(argText)), argText);
});

test('/generate: the shape bench_serving --backend sglang sends and reads', async () => {
  const res = await fetch(`${base}/generate`, {
    method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ text: 'def fibonacci(n):', sampling_params: { temperature: 0.0, max_new_tokens: 12, ignore_eos: true },
      stream: true, lora_path: null, return_logprob: false, logprob_start_len: -1 }),
  });
  assert.equal(res.status, 200);
  const body = await res.text();
  const events = body.split('\n\n').filter((e) => e.startsWith('data: ')).map((e) => e.slice(6));
  assert.equal(events.at(-1), '[DONE]');
  let prev = '';
  let last;
  for (const e of events.slice(0, -1)) {
    last = JSON.parse(e);
    assert.ok(last.text.startsWith(prev), 'cumulative text');
    prev = last.text;
  }
  assert.equal(last.meta_info.completion_tokens, 12);
  assert.deepEqual(last.meta_info.finish_reason, { type: 'length', length: 12 });
  const one = await (await fetch(`${base}/generate`, { method: 'POST', headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ text: 'def fibonacci(n):', sampling_params: { temperature: 0.0, max_new_tokens: 12, ignore_eos: true } }) })).json();
  assert.equal(one.text, prev);
  assert.equal(one.output_ids.length, 12);
});

test('Responses API through the openai client: create, stream, retrieve', async () => {
  const r = await client.responses.create({ model: 'tiny-coder', input: 'Say hi.', max_output_tokens: 16, temperature: 0 });
  assert.equal(r.object, 'response');
  assert.ok(['completed', 'incomplete'].includes(r.status));
  assert.equal(typeof r.output_text, 'string');
  const got = await client.responses.retrieve(r.id);
  assert.equal(got.id, r.id);
  assert.deepEqual(got.output, r.output);
  const stream = await client.responses.create({ model: 'tiny-coder', input: 'Say hi.', max_output_tokens: 16, temperature: 0, stream: true });
  const types = [];
  let text = '';
  for await (const ev of stream) {
    types.push(ev.type);
    if (ev.type === 'response.output_text.delta') text += ev.delta;
  }
  assert.equal(types[0], 'response.created');
  assert.ok(['response.completed', 'response.incomplete'].includes(types.at(-1)), types.join(','));
  assert.equal(text, r.output_text);
  // Forced function call with a JSON schema: a function_call item with valid arguments.
  const fr = await client.responses.create({
    model: 'tiny-coder', input: 'Weather?', tool_choice: 'required', temperature: 1, max_output_tokens: 300,
    reasoning: { effort: 'none' },
    tools: [{ type: 'function', name: 'get_weather', parameters: TOOLS[0].function.parameters }],
  });
  const fc = fr.output.find((o) => o.type === 'function_call');
  assert.ok(fc, JSON.stringify(fr.output));
  assert.ok(ajv.compile(TOOLS[0].function.parameters)(JSON.parse(fc.arguments)), fc.arguments);
});
