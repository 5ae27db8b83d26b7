#!/usr/bin/env bash
# HTTP vs offline throughput on the same workload (issue #4 benchmark; goal HTTP/offline >= 0.9).
#   bench/serve/run.sh [MODEL_DIR] [extra serve flags...]
# Env: BIN (default build/src/app/deltaserve), CONC (1,8,32), INPUT_LEN (16 tokens), GEN_LEN (128),
#      PORT (free port), OUT (bench/serve/out), CLIENT (cpp | node), REPEAT (3), THREADS (nproc),
#      OFFLINE_ARGS (extra bench-offline flags, e.g. "--device cuda --load-format dummy" to match
#      serve flags "--device cuda --load-format dummy").
#
# HTTP: `deltaserve bench` streams max(8, 4 x C) /v1/completions requests with at most C in flight
# (ignore_eos, so each yields exactly GEN_LEN tokens). Offline: `deltaserve bench-offline --workload`
# runs the same requests (same prompt token count, same lengths, same closed loop) through the
# Engine in process. The ratio is the cost of HTTP, JSON, tokenization, detokenization and SSE.
# The client runs on the same machine as the server; the C++ client costs ~0.1 core, the Node one
# (CLIENT=node, bench_http.mjs) ~0.3 core, which on a 2-core box is taken from the compute threads.
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${BIN:-build/src/app/deltaserve}"
MODEL="${1:-models/tiny-coder}"; shift || true
CONC="${CONC:-1,8,32}"
INPUT_LEN="${INPUT_LEN:-16}"
GEN_LEN="${GEN_LEN:-128}"
OUT="${OUT:-bench/serve/out}"
CLIENT="${CLIENT:-cpp}"
PORT="${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}"
mkdir -p "$OUT"

# The VM this was written on is noisy (+-20% between runs a minute apart), so HTTP and offline
# runs alternate REPEAT times and the table compares medians.
REPEAT="${REPEAT:-3}"
THREADS="${THREADS:-$(nproc)}"  # serve's default: all usable CPUs
for rep in $(seq 1 "$REPEAT"); do
  echo "== round $rep/$REPEAT: HTTP (deltaserve serve on 127.0.0.1:$PORT, client $CLIENT)"
  "$BIN" serve --model-path "$MODEL" --host 127.0.0.1 --port "$PORT" --served-model-name bench \
    --max-running-requests 64 --threads "$THREADS" --state-dir "$OUT/state" "$@" > "$OUT/serve.log" 2>&1 &
  SERVER=$!
  trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
  for _ in $(seq 1 600); do
    grep -q "listening on" "$OUT/serve.log" && break
    kill -0 $SERVER 2>/dev/null || { cat "$OUT/serve.log"; exit 1; }
    sleep 0.2
  done
  if [ "$CLIENT" = node ]; then
    node bench/serve/bench_http.mjs --base "http://127.0.0.1:$PORT" --model bench --concurrency "$CONC" \
      --prompt-len "$INPUT_LEN" --gen-len "$GEN_LEN" --json > "$OUT/http.$rep.json"
    PROMPT_TOKENS="$INPUT_LEN"
  else
    "$BIN" bench --url "http://127.0.0.1:$PORT" --model bench --concurrency "$CONC" --input-len "$INPUT_LEN" \
      --output-len "$GEN_LEN" --output "$OUT/http.$rep.json" --svg "$OUT/http.svg" --state-dir "$OUT/state" 2>&1 \
      | grep -v "^concurrency"
    # Mean prompt tokens of the HTTP requests, so the offline run sees prompts of the same length.
    PROMPT_TOKENS=$(python3 -c 'import json,sys; L=json.load(open(sys.argv[1]))["levels"]; print(round(sum(l["input_tokens"] for l in L)/sum(l["completed"] for l in L)))' "$OUT/http.$rep.json")
  fi
  kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true

  echo "== round $rep/$REPEAT: offline (engine in process, no HTTP; prompts of $PROMPT_TOKENS tokens)"
  "$BIN" bench-offline --model "$MODEL" --threads "$THREADS" --batch "$CONC" --prompt-len "$PROMPT_TOKENS" \
    --gen-len "$GEN_LEN" --workload ${OFFLINE_ARGS:-} --json > "$OUT/offline.$rep.txt"
  sed -n '1,/^\[/p' "$OUT/offline.$rep.txt" | sed '$d'
done

python3 - "$OUT" "$REPEAT" "$CLIENT" <<'PY'
import json, statistics, sys
out, repeat, client = sys.argv[1], int(sys.argv[2]), sys.argv[3]
http, off = {}, {}
for rep in range(1, repeat + 1):
    h = json.load(open(f"{out}/http.{rep}.json"))
    for r in (h["levels"] if client == "cpp" else h["results"]):
        ttft = r["ttft_ms"]["p50"] if isinstance(r.get("ttft_ms"), dict) else r["ttft_ms_p50"]
        http.setdefault(r["concurrency"], []).append((r.get("output_tokens_per_s", r.get("output_tok_s")), ttft))
    text = open(f"{out}/offline.{rep}.txt").read()
    for o in json.loads(text[text.index("\n[") + 1:]):
        off.setdefault(o["batch"], []).append((o["workload_output_tokens_per_second"], o.get("decode_only_tokens_per_second", o["decode_tokens_per_second"])))
med = lambda xs: statistics.median(xs)
print(f"medians of {repeat} alternating rounds")
print(f"{'conc':>5} {'HTTP tok/s':>11} {'offline tok/s':>14} {'ratio':>6} {'HTTP TTFT p50 ms':>17}  offline decode-only tok/s")
for c in sorted(http):
    h = med([x[0] for x in http[c]]); o = med([x[0] for x in off[c]])
    print(f"{c:>5} {h:>11.1f} {o:>14.1f} {h / o:>6.2f} {med([x[1] for x in http[c]]):>17.1f}  {med([x[1] for x in off[c]]):.1f}")
PY
