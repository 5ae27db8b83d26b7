#!/usr/bin/env bash
# HTTP vs offline throughput at the same batch sizes (issue #4 benchmark; goal HTTP/offline >= 0.9).
#   bench/serve/run.sh [MODEL_DIR] [extra serve flags...]
# Env: BIN (default build/src/app/deltaserve), CONC (1,8,32), PROMPT_LEN (128), GEN_LEN (128),
#      PORT (free port), OUT (bench/serve/out).
set -euo pipefail
cd "$(dirname "$0")/../.."
BIN="${BIN:-build/src/app/deltaserve}"
MODEL="${1:-models/tiny-coder}"; shift || true
CONC="${CONC:-1,8,32}"
PROMPT_LEN="${PROMPT_LEN:-128}"
GEN_LEN="${GEN_LEN:-128}"
OUT="${OUT:-bench/serve/out}"
PORT="${PORT:-$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')}"
mkdir -p "$OUT"

echo "== offline (engine, no HTTP)"
"$BIN" bench-offline --model "$MODEL" --batch "$CONC" --prompt-len "$PROMPT_LEN" --gen-len "$GEN_LEN" --json \
  | tee "$OUT/offline.json"

echo "== HTTP (deltaserve serve on 127.0.0.1:$PORT)"
"$BIN" serve --model-path "$MODEL" --host 127.0.0.1 --port "$PORT" --served-model-name bench \
  --max-running-requests 64 "$@" > "$OUT/serve.log" 2>&1 &
SERVER=$!
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true' EXIT
for _ in $(seq 1 600); do
  grep -q "listening on" "$OUT/serve.log" && break
  kill -0 $SERVER 2>/dev/null || { cat "$OUT/serve.log"; exit 1; }
  sleep 0.2
done
node bench/serve/bench_http.mjs --base "http://127.0.0.1:$PORT" --model bench --concurrency "$CONC" \
  --prompt-len "$PROMPT_LEN" --gen-len "$GEN_LEN" --json | tee "$OUT/http.json"
