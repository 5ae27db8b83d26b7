// HTTP serving benchmark: aggregate output tokens/s and TTFT for C concurrent streams against a
// running `deltaserve serve` (or any OpenAI-compatible server), /v1/completions with ignore_eos so
// every request generates exactly --gen-len tokens. Node ≥ 20, no dependencies (fetch + SSE).
//
//   node bench/serve/bench_http.mjs --base http://127.0.0.1:30000 --concurrency 1,8,32 \
//        --prompt-len 128 --gen-len 128 [--requests-per-stream 2] [--json]
//
// Prints one line per concurrency: output tok/s (sum over streams / wall time), mean and p50/p99
// TTFT, mean inter-token latency.
const args = Object.fromEntries(process.argv.slice(2).reduce((acc, a, i, all) => {
  if (a.startsWith('--')) acc.push([a.slice(2), all[i + 1] && !all[i + 1].startsWith('--') ? all[i + 1] : 'true']);
  return acc;
}, []));
const base = args.base ?? 'http://127.0.0.1:30000';
const concurrency = (args.concurrency ?? '1,8,32').split(',').map(Number);
const promptLen = Number(args['prompt-len'] ?? 128);
const genLen = Number(args['gen-len'] ?? 128);
const perStream = Number(args['requests-per-stream'] ?? 2);
const model = args.model ?? 'default';
const headers = { 'Content-Type': 'application/json' };
if (args['api-key']) headers.Authorization = `Bearer ${args['api-key']}`;

// A prompt of about promptLen tokens: token ids, so the length is exact.
function promptIds(seed) {
  const ids = [];
  let x = seed * 2654435761 % 4294967296;
  for (let i = 0; i < promptLen; i++) { x = (x * 1103515245 + 12345) % 2147483648; ids.push(100 + (x % 5000)); }
  return ids;
}

async function oneRequest(seed) {
  const t0 = performance.now();
  const r = await fetch(`${base}/v1/completions`, {
    method: 'POST', headers,
    body: JSON.stringify({ model, prompt: promptIds(seed), max_tokens: genLen, temperature: 0,
      ignore_eos: true, stream: true, stream_options: { include_usage: true } }),
  });
  if (!r.ok) throw new Error(`HTTP ${r.status}: ${await r.text()}`);
  const decoder = new TextDecoder();
  let buf = '';
  let ttft = null;
  let tokens = 0;
  let last = t0;
  for await (const part of r.body) {
    buf += decoder.decode(part, { stream: true });
    let idx;
    while ((idx = buf.indexOf('\n\n')) >= 0) {
      const line = buf.slice(0, idx);
      buf = buf.slice(idx + 2);
      if (!line.startsWith('data: ') || line === 'data: [DONE]') continue;
      const chunk = JSON.parse(line.slice(6));
      if (chunk.usage) { tokens = chunk.usage.completion_tokens; continue; }
      if (ttft === null && chunk.choices?.[0]?.text) ttft = performance.now() - t0;
      last = performance.now();
    }
  }
  return { ttft: ttft ?? (last - t0), tokens, total: last - t0 };
}

function pct(sorted, p) { return sorted[Math.min(sorted.length - 1, Math.floor(p * sorted.length))]; }

const results = [];
await oneRequest(999);  // warm-up
for (const c of concurrency) {
  const t0 = performance.now();
  const runs = await Promise.all(Array.from({ length: c }, async (_, s) => {
    const out = [];
    for (let k = 0; k < perStream; k++) out.push(await oneRequest(s * 100 + k));
    return out;
  }));
  const wall = (performance.now() - t0) / 1000;
  const flat = runs.flat();
  const tokens = flat.reduce((a, r) => a + r.tokens, 0);
  const ttfts = flat.map((r) => r.ttft).sort((a, b) => a - b);
  const itl = flat.reduce((a, r) => a + (r.total - r.ttft) / Math.max(1, r.tokens - 1), 0) / flat.length;
  const row = {
    concurrency: c, requests: flat.length, output_tokens: tokens, wall_s: +wall.toFixed(3),
    output_tok_s: +(tokens / wall).toFixed(1),
    ttft_ms_mean: +(ttfts.reduce((a, b) => a + b, 0) / ttfts.length).toFixed(1),
    ttft_ms_p50: +pct(ttfts, 0.5).toFixed(1), ttft_ms_p99: +pct(ttfts, 0.99).toFixed(1),
    itl_ms_mean: +itl.toFixed(2),
  };
  results.push(row);
  if (!args.json) {
    console.log(`c=${c}\t${row.output_tok_s} tok/s\tTTFT mean ${row.ttft_ms_mean} ms (p50 ${row.ttft_ms_p50}, p99 ${row.ttft_ms_p99})\tITL ${row.itl_ms_mean} ms`);
  }
}
if (args.json) console.log(JSON.stringify({ base, prompt_len: promptLen, gen_len: genLen, results }, null, 2));
