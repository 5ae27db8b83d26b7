// The status page: GET / serves one HTML page (markup, style and script below, no build step) that
// polls GET /status.json every second and shows the memory plan, live load, throughput (computed
// in the page between polls from the token counters), the MTP accept length, recent launches
// from the launch database (with an SVG plot of their measured tok/s), and a streaming chat box.
//
// Auth (docs/operations.md, "Status page"): GET / is static and needs no key; /status.json and
// the chat request need it. The page asks for the key when a data request answers 401 and sends
// it as a Bearer header (kept in sessionStorage, i.e. for this tab only).
#include <chrono>

#include "server/json_util.h"
#include "server/openai_server.h"
#include "util/log.h"

namespace deltaserve {

using json = nlohmann::ordered_json;

namespace {

// The page. Element ids are part of the interface (tests read them): plan-*, running, waiting,
// kv-used, kv-total, slots-used, slots-total, gen-tokens, prompt-tokens, gen-tps, accept-length,
// launches-plot, launches-body, chat-form, chat-input, chat-log, chat-status, api-key.
// Every value from the server is written with textContent (never parsed as HTML).
constexpr const char kStatusPage[] = R"HTML(<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>deltaserve status</title>
<link rel="icon" href="data:,">
<style>
  :root { --fg:#1d232b; --dim:#68717d; --bg:#f6f7f9; --card:#fff; --line:#dde1e6; --acc:#2f6fdb; --warn:#c4471b; }
  * { box-sizing: border-box; }
  body { margin:0; font:14px/1.4 system-ui, sans-serif; color:var(--fg); background:var(--bg); }
  header { display:flex; gap:1em; align-items:baseline; flex-wrap:wrap; padding:.8em 1.2em; background:var(--card); border-bottom:1px solid var(--line); }
  header h1 { font-size:1.2em; margin:0; }
  #conn-state { margin-left:auto; color:var(--dim); }
  #conn-state.error { color:var(--warn); }
  main { display:grid; grid-template-columns:repeat(auto-fit, minmax(320px, 1fr)); gap:1em; padding:1em 1.2em; }
  section { background:var(--card); border:1px solid var(--line); border-radius:6px; padding:.8em 1em; }
  section.wide { grid-column:1 / -1; }
  h2 { font-size:1em; margin:0 0 .6em; color:var(--dim); text-transform:uppercase; letter-spacing:.04em; }
  dl { display:grid; grid-template-columns:max-content 1fr; gap:.25em 1em; margin:0; }
  dt { color:var(--dim); }
  dd { margin:0; font-variant-numeric:tabular-nums; }
  .big { font-size:1.6em; font-weight:600; }
  .bar { height:8px; background:var(--line); border-radius:4px; overflow:hidden; margin:.2em 0 .6em; }
  .bar > div { height:100%; width:0; background:var(--acc); transition:width .3s; }
  table { border-collapse:collapse; width:100%; font-variant-numeric:tabular-nums; }
  th, td { text-align:left; padding:.25em .5em; border-bottom:1px solid var(--line); white-space:nowrap; }
  th { color:var(--dim); font-weight:normal; }
  tr.current td { background:#eef4ff; }
  #auth { display:none; gap:.5em; align-items:center; padding:.6em 1.2em; background:#fff4e5; border-bottom:1px solid var(--line); }
  #auth.shown { display:flex; }
  #chat-log { max-height:320px; overflow:auto; display:flex; flex-direction:column; gap:.4em; margin-bottom:.6em; }
  .msg { padding:.4em .6em; border-radius:6px; white-space:pre-wrap; word-break:break-word; }
  .msg.user { background:#eef4ff; align-self:flex-end; }
  .msg.assistant { background:#f0f1f3; }
  .msg .reasoning { color:var(--dim); font-style:italic; }
  #chat-form { display:flex; gap:.5em; }
  #chat-input { flex:1; font:inherit; padding:.4em; }
  #chat-status { color:var(--dim); font-size:.9em; margin-top:.3em; min-height:1.2em; }
  #launches-plot { width:100%; height:160px; display:block; margin-bottom:.6em; }
  #launches-plot .bar-rect { fill:var(--acc); }
  #launches-plot .bar-rect.current { fill:#1b9e5a; }
  #launches-plot text { font-size:11px; fill:var(--dim); }
</style>
</head>
<body>
<header>
  <h1>deltaserve</h1>
  <span>model <b id="model">-</b></span>
  <span>launch <b id="launch-id">-</b></span>
  <span>version <span id="version">-</span></span>
  <span>up <span id="uptime">-</span></span>
  <span id="conn-state">connecting...</span>
</header>
<form id="auth">
  <label for="api-key">This server needs its API key:</label>
  <input id="api-key" type="password" autocomplete="off" placeholder="--api-key">
  <button id="api-key-save" type="submit">Use key</button>
</form>
<main>
  <section>
    <h2>Memory plan</h2>
    <dl>
      <dt>KV cache tokens</dt><dd id="plan-kv-tokens">-</dd>
      <dt>KV cache dtype</dt><dd id="plan-kv-dtype">-</dd>
      <dt>Running-request cap</dt><dd id="plan-max-running">-</dd>
      <dt>State slots</dt><dd id="plan-state-slots">-</dd>
      <dt>Checkpoint slots</dt><dd id="plan-checkpoint-slots">-</dd>
      <dt>Context length</dt><dd id="plan-context">-</dd>
      <dt>Page size</dt><dd id="plan-page-size">-</dd>
      <dt>Device</dt><dd id="plan-device">-</dd>
      <dt>MTP steps</dt><dd id="plan-spec-steps">-</dd>
      <dt>Weights / KV / state</dt><dd id="plan-memory">-</dd>
    </dl>
  </section>
  <section>
    <h2>Load</h2>
    <dl>
      <dt>Running</dt><dd><span class="big" id="running">-</span></dd>
      <dt>Waiting</dt><dd><span class="big" id="waiting">-</span></dd>
      <dt>Open streams</dt><dd id="streams-open">-</dd>
    </dl>
    <div>KV tokens <span id="kv-used">-</span> / <span id="kv-total">-</span> (<span id="kv-pct">-</span>)</div>
    <div class="bar"><div id="kv-bar"></div></div>
    <div>State slots <span id="slots-used">-</span> / <span id="slots-total">-</span></div>
    <div class="bar"><div id="slots-bar"></div></div>
  </section>
  <section>
    <h2>Throughput</h2>
    <dl>
      <dt>Generated tok/s</dt><dd><span class="big" id="gen-tps">-</span></dd>
      <dt>Prompt tok/s</dt><dd id="prompt-tps">-</dd>
      <dt>Generated tokens</dt><dd id="gen-tokens">-</dd>
      <dt>Prompt tokens</dt><dd id="prompt-tokens">-</dd>
      <dt>From prefix cache</dt><dd id="cached-tokens">-</dd>
      <dt>MTP accept length</dt><dd id="accept-length">-</dd>
      <dt>Engine steps</dt><dd id="engine-steps">-</dd>
    </dl>
  </section>
  <section class="wide">
    <h2>Recent launches</h2>
    <svg id="launches-plot" role="img" aria-label="measured output tok/s per launch"></svg>
    <div style="overflow-x:auto">
    <table>
      <thead><tr><th>#</th><th>started (UTC)</th><th>state</th><th>model</th><th>context</th><th>running cap</th>
        <th>KV dtype</th><th>MTP</th><th>measured</th><th>best tok/s</th><th>TTFT p50</th><th>ITL p50</th><th>accept</th></tr></thead>
      <tbody id="launches-body"></tbody>
    </table>
    </div>
    <div id="launches-note" style="color:var(--dim)"></div>
  </section>
  <section class="wide">
    <h2>Chat</h2>
    <div id="chat-log"></div>
    <form id="chat-form">
      <input id="chat-input" autocomplete="off" placeholder="Send a message (streamed from /v1/chat/completions)">
      <button id="chat-send" type="submit">Send</button>
      <button id="chat-clear" type="button">Clear</button>
    </form>
    <div id="chat-status"></div>
  </section>
</main>
<script>
'use strict';
const $ = (id) => document.getElementById(id);
const KEY = 'deltaserve-api-key';
let apiKey = sessionStorage.getItem(KEY) || '';
let prev = null;          // the previous poll: {t, gen, prompt}
let latest = null;        // the latest /status.json
let chat = [];            // chat messages

function headers(extra) {
  const h = Object.assign({}, extra || {});
  if (apiKey) h['Authorization'] = 'Bearer ' + apiKey;
  return h;
}
function set(id, v) { $(id).textContent = (v === null || v === undefined || v === '') ? '-' : String(v); }
function bytes(n) {
  if (!(n > 0)) return '0';
  const u = ['B', 'KiB', 'MiB', 'GiB', 'TiB']; let i = 0;
  while (n >= 1024 && i < u.length - 1) { n /= 1024; i++; }
  return n.toFixed(i ? 1 : 0) + ' ' + u[i];
}
function duration(s) {
  s = Math.floor(s);
  const h = Math.floor(s / 3600), m = Math.floor(s % 3600 / 60);
  return (h ? h + 'h ' : '') + (h || m ? m + 'm ' : '') + (s % 60) + 's';
}
function conn(text, error) { const e = $('conn-state'); e.textContent = text; e.className = error ? 'error' : ''; }
function needKey(why) {
  $('auth').className = 'shown';
  conn(why, true);
  $('api-key').focus();
}

function render(s) {
  set('model', s.model); set('launch-id', s.launch_id || 'not recorded'); set('version', s.version);
  set('uptime', duration(s.uptime_seconds));
  const p = s.plan;
  set('plan-kv-tokens', p.kv_tokens); set('plan-kv-dtype', p.kv_cache_dtype);
  set('plan-max-running', p.max_running_requests); set('plan-state-slots', p.state_slots);
  set('plan-checkpoint-slots', p.checkpoint_slots); set('plan-context', p.context_length);
  set('plan-page-size', p.page_size); set('plan-device', p.device);
  set('plan-spec-steps', p.speculative_num_steps ? p.speculative_num_steps : 'off');
  const m = p.memory;
  set('plan-memory', m ? [m.weights_bytes, m.kv_cache_bytes, m.state_cache_bytes].map(bytes).join(' / ') : '');
  set('running', s.requests_running); set('waiting', s.requests_waiting); set('streams-open', s.http_streams_open);
  set('kv-used', s.kv_tokens_used); set('kv-total', s.kv_tokens_total);
  const kvr = s.kv_tokens_total > 0 ? s.kv_tokens_used / s.kv_tokens_total : 0;
  set('kv-pct', (100 * kvr).toFixed(1) + '%'); $('kv-bar').style.width = (100 * kvr) + '%';
  set('slots-used', s.state_slots_used); set('slots-total', s.state_slots_total);
  $('slots-bar').style.width = (s.state_slots_total > 0 ? 100 * s.state_slots_used / s.state_slots_total : 0) + '%';
  set('gen-tokens', s.generation_tokens_total); set('prompt-tokens', s.prompt_tokens_total);
  set('cached-tokens', s.prompt_tokens_cached_total); set('engine-steps', s.engine_steps_total);
  set('accept-length', s.spec_verify_steps_total > 0 ? s.spec_accept_length.toFixed(2) : 'no MTP steps yet');
  // Throughput between this poll and the previous one (server time; a restart resets).
  const now = { t: s.uptime_seconds, gen: s.generation_tokens_total, prompt: s.prompt_tokens_total };
  if (prev && now.t > prev.t && now.gen >= prev.gen && now.prompt >= prev.prompt) {
    const dt = now.t - prev.t;
    set('gen-tps', ((now.gen - prev.gen) / dt).toFixed(1));
    set('prompt-tps', ((now.prompt - prev.prompt) / dt).toFixed(1));
  }
  prev = now;
  renderLaunches(s);
}

function svg(tag, attrs, text) {
  const e = document.createElementNS('http://www.w3.org/2000/svg', tag);
  for (const [k, v] of Object.entries(attrs)) e.setAttribute(k, v);
  if (text !== undefined) e.textContent = text;
  return e;
}

function renderLaunches(s) {
  const body = $('launches-body'), plot = $('launches-plot');
  body.replaceChildren(); plot.replaceChildren();
  if (!Array.isArray(s.launches)) { set('launches-note', 'launch history unavailable: ' + (s.launches_error || 'not recorded')); return; }
  $('launches-note').textContent = s.launches.length ? '' : 'no launches recorded';
  for (const l of s.launches) {
    const tr = document.createElement('tr');
    tr.dataset.launch = l.launch_id;
    if (l.launch_id === s.launch_id) tr.className = 'current';
    const st = l.settings || {}, last = (l.measurements || [])[0];
    const model = (l.model_path || '').split('/').filter(Boolean).pop() || l.model_path;
    const cells = [l.launch_id, l.started_at, l.state, model, st['context-length'], st['max-running-requests'],
      st['kv-cache-dtype'], st['speculative-algorithm'] ? st['speculative-num-steps'] : 'off', l.n_measurements,
      l.n_measurements ? l.best_output_tokens_per_s.toFixed(1) + ' @' + l.best_concurrency : '-',
      last ? last.ttft_p50_ms.toFixed(1) + ' ms' : '-', last ? last.itl_p50_ms.toFixed(1) + ' ms' : '-',
      last && last.accept_length > 0 ? last.accept_length.toFixed(2) : '-'];
    for (const c of cells) { const td = document.createElement('td'); td.textContent = (c === undefined || c === '') ? '-' : String(c); tr.appendChild(td); }
    if (l.model_path) tr.title = l.model_path;
    body.appendChild(tr);
  }
  // Plot: best measured output tok/s per launch, oldest on the left.
  const ls = s.launches.slice().reverse();
  const W = plot.clientWidth || 600, H = plot.clientHeight || 160, padL = 44, padB = 18, padT = 16;
  plot.setAttribute('viewBox', `0 0 ${W} ${H}`);
  const max = Math.max(1, ...ls.map((l) => l.best_output_tokens_per_s || 0));
  plot.appendChild(svg('line', { x1: padL, y1: H - padB, x2: W, y2: H - padB, stroke: '#bbb' }));
  plot.appendChild(svg('text', { x: padL - 4, y: padT + 4, 'text-anchor': 'end' }, max.toFixed(0)));
  plot.appendChild(svg('text', { x: padL - 4, y: H - padB, 'text-anchor': 'end' }, '0'));
  plot.appendChild(svg('text', { x: padL - 4, y: (H - padB + padT) / 2 + 4, 'text-anchor': 'end' }, 'tok/s'));
  const slot = ls.length ? (W - padL) / ls.length : 0;
  ls.forEach((l, i) => {
    const v = l.best_output_tokens_per_s || 0, h = (H - padB - padT) * v / max;
    const w = Math.max(2, Math.min(slot * 0.7, 56)), x = padL + i * slot + (slot - w) / 2;
    const r = svg('rect', { x, y: H - padB - h, width: w, height: Math.max(h, 0), class: 'bar-rect' + (l.launch_id === s.launch_id ? ' current' : ''), 'data-launch': l.launch_id, 'data-value': v });
    r.appendChild(svg('title', {}, `launch #${l.launch_id}: ` + (l.n_measurements ? v.toFixed(1) + ' tok/s @' + l.best_concurrency : 'not measured')));
    plot.appendChild(r);
    plot.appendChild(svg('text', { x: x + w / 2, y: H - 4, 'text-anchor': 'middle' }, '#' + l.launch_id));
    if (l.n_measurements) plot.appendChild(svg('text', { x: x + w / 2, y: H - padB - h - 3, 'text-anchor': 'middle' }, v.toFixed(0)));
  });
}

async function poll() {
  try {
    const r = await fetch('status.json', { headers: headers(), cache: 'no-store' });
    if (r.status === 401) { needKey(apiKey ? 'the API key was refused' : 'API key required'); return; }
    if (!r.ok) { conn('status.json: HTTP ' + r.status, true); return; }
    latest = await r.json();
    $('auth').className = '';
    render(latest);
    conn('updated ' + new Date().toLocaleTimeString(), false);
    document.body.dataset.polls = String(Number(document.body.dataset.polls || 0) + 1);
  } catch (e) {
    conn('server unreachable: ' + e.message, true);
  } finally {
    setTimeout(poll, 1000);
  }
}

$('auth').addEventListener('submit', (e) => {
  e.preventDefault();
  apiKey = $('api-key').value.trim();
  sessionStorage.setItem(KEY, apiKey);
  conn('trying the key...', false);
});
$('chat-clear').addEventListener('click', () => { chat = []; $('chat-log').replaceChildren(); set('chat-status', ''); });

function bubble(role, text) {
  const d = document.createElement('div');
  d.className = 'msg ' + role;
  if (text !== undefined) d.textContent = text;
  $('chat-log').appendChild(d);
  return d;
}

$('chat-form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const text = $('chat-input').value.trim();
  if (!text) return;
  $('chat-input').value = '';
  $('chat-send').disabled = true;
  chat.push({ role: 'user', content: text });
  bubble('user', text);
  const out = bubble('assistant');
  const reasoning = document.createElement('span'); reasoning.className = 'reasoning';
  const content = document.createElement('span'); content.className = 'content';
  out.append(reasoning, content);
  $('chat-status').textContent = 'waiting for the first token...';
  let finish = null, usage = null, answer = '';
  try {
    const body = { model: latest ? latest.model : 'default', messages: chat, stream: true,
                   stream_options: { include_usage: true }, max_tokens: 256 };
    const r = await fetch('v1/chat/completions', { method: 'POST', headers: headers({ 'Content-Type': 'application/json' }), body: JSON.stringify(body) });
    if (r.status === 401) { needKey('API key required for chat'); throw new Error('401: API key required'); }
    if (!r.ok) { const e = await r.json().catch(() => null); throw new Error('HTTP ' + r.status + (e && e.error ? ': ' + e.error.message : '')); }
    const reader = r.body.getReader(), dec = new TextDecoder();
    let buf = '';
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      buf += dec.decode(value, { stream: true });
      let at;
      while ((at = buf.indexOf('\n\n')) >= 0) {
        const ev = buf.slice(0, at); buf = buf.slice(at + 2);
        for (const line of ev.split('\n')) {
          if (!line.startsWith('data: ')) continue;
          const data = line.slice(6);
          if (data === '[DONE]') continue;
          const chunk = JSON.parse(data);
          if (chunk.error) throw new Error(chunk.error.message || 'stream error');
          if (chunk.usage) usage = chunk.usage;
          for (const c of chunk.choices || []) {
            const d = c.delta || {};
            if (d.reasoning_content) reasoning.textContent += d.reasoning_content;
            if (d.content) { content.textContent += d.content; answer += d.content; }
            if (c.finish_reason) finish = c.finish_reason;
          }
          $('chat-status').textContent = 'streaming...';
        }
      }
    }
    chat.push({ role: 'assistant', content: answer });
    $('chat-status').textContent = 'finish_reason: ' + (finish || 'none') +
      (usage ? ` (${usage.prompt_tokens} prompt + ${usage.completion_tokens} completion tokens)` : '');
  } catch (e) {
    chat.pop();
    out.classList.add('error');
    $('chat-status').textContent = 'error: ' + e.message;
  } finally {
    $('chat-send').disabled = false;
  }
});

poll();
</script>
</body>
</html>
)HTML";

double num_or(const json& info, const char* key, double fallback) {
  auto it = info.find(key);
  return it != info.end() && it->is_number() ? it->get<double>() : fallback;
}

}  // namespace

json OpenAiServer::status_json() {
  const EngineStats st = engine_.stats();
  const json& info = config_.server_info;
  auto pick = [&](const char* key) -> json {
    auto it = info.find(key);
    return it != info.end() ? *it : json(nullptr);
  };
  json plan = json::object();
  // The memory plan as /get_server_info reports it (max_total_num_tokens etc.); the engine's own
  // figures where the plan has no entry (a server started without cmd_serve's info).
  plan["kv_tokens"] = num_or(info, "max_total_num_tokens", -1) >= 0 ? pick("max_total_num_tokens") : json(st.kv_tokens_total);
  plan["kv_cache_dtype"] = pick("kv_cache_dtype");
  plan["max_running_requests"] = pick("max_running_requests");
  plan["state_slots"] = st.state_slots_total;
  plan["checkpoint_slots"] = pick("checkpoint_slots");
  plan["context_length"] = engine_.context_length();
  plan["page_size"] = pick("page_size");
  plan["prefix_cache"] = pick("prefix_cache");
  plan["device"] = pick("device");
  plan["speculative_num_steps"] = config_.speculative_num_steps;
  plan["memory"] = pick("memory");

  json s = json::object();
  s["model"] = config_.served_model_name;
  s["version"] = pick("version");
  s["launch_id"] = config_.launch_id;
  s["uptime_seconds"] = std::chrono::duration<double>(std::chrono::steady_clock::now() - started_).count();
  s["plan"] = std::move(plan);
  // Live figures: named as in /metrics without the "deltaserve_" prefix, from one engine snapshot.
  s["requests_running"] = st.requests_running;
  s["requests_waiting"] = st.requests_waiting;
  s["kv_tokens_used"] = st.kv_tokens_used;
  s["kv_tokens_total"] = st.kv_tokens_total;
  s["state_slots_used"] = st.state_slots_used;
  s["state_slots_total"] = st.state_slots_total;
  s["prompt_tokens_total"] = st.prompt_tokens_total;
  s["prompt_tokens_cached_total"] = st.prompt_tokens_cached_total;
  s["generation_tokens_total"] = st.generated_tokens_total;
  s["spec_draft_tokens_total"] = st.spec_draft_tokens_total;
  s["spec_accepted_tokens_total"] = st.spec_accepted_tokens_total;
  s["spec_verify_steps_total"] = st.spec_verify_steps_total;
  // As sglang:spec_accept_length: 1 + accepted / verification steps (0 before any step).
  s["spec_accept_length"] =
      st.spec_verify_steps_total > 0
          ? 1.0 + static_cast<double>(st.spec_accepted_tokens_total) / static_cast<double>(st.spec_verify_steps_total)
          : 0.0;
  s["engine_steps_total"] = st.steps_total;
  s["preemptions_total"] = st.preemptions_total;
  s["http_streams_open"] = metrics_.open_streams();
  if (!config_.launch_history) {
    s["launches"] = nullptr;
    s["launches_error"] = "this server has no launch database";
  } else {
    try {
      Result<json> launches = config_.launch_history();
      if (launches) {
        s["launches"] = *launches;
      } else {
        s["launches"] = nullptr;
        s["launches_error"] = launches.status().message();
      }
    } catch (const std::exception& e) {
      s["launches"] = nullptr;
      s["launches_error"] = e.what();
    }
  }
  return s;
}

bool OpenAiServer::handle_status(const HttpRequest& req, std::shared_ptr<HttpExchange>& exchange) {
  const std::string& path = req.path;
  if (path != "/" && path != "/status.json") return false;
  if (req.method != "GET" && req.method != "HEAD") {
    send_error(*exchange, path, ApiError::method_not_allowed("GET"));
    return true;
  }
  // Never cached: the figures are live, and the page must not outlive a key change.
  HttpHeaders h = {{"Cache-Control", "no-store"}, {"X-Content-Type-Options", "nosniff"}};
  if (path == "/") {
    // Inline script and style only; nothing is loaded from elsewhere, and no other site may frame it.
    h.emplace_back("Content-Security-Policy",
                   "default-src 'none'; script-src 'unsafe-inline'; style-src 'unsafe-inline'; "
                   "connect-src 'self'; img-src 'self' data:; frame-ancestors 'none'; base-uri 'none'; form-action 'none'");
    h.emplace_back("X-Frame-Options", "DENY");
    metrics_.count_request("/", 200);
    exchange->respond(200, "text/html; charset=utf-8", std::string(kStatusPage, sizeof kStatusPage - 1), std::move(h));
    return true;
  }
  metrics_.count_request("/status.json", 200);
  exchange->respond(200, "application/json", safe_dump(status_json()), std::move(h));
  return true;
}

}  // namespace deltaserve
