#!/usr/bin/env bash
# tools/gpu-serve-check.sh: the whole product on a GPU machine: `generate` (plain and MTP) and
# `serve` with a chat request, on the CUDA backend, plus the engine-level 27B-shape throughput.
#   BIN=path/to/deltaserve (built with -DDELTASERVE_CUDA=ON); logs go to $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/build/src/app/deltaserve}
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
cd "$ROOT"
M=models/tiny-coder
P=$'def fibonacci(n):\n'
echo "== generate (cuda, greedy)"
"$BIN" generate --device cuda --model $M --prompt "$P" --max-tokens 48 --temperature 0 --json | tee "$OUT/gen.json"
echo "== generate (cuda, MTP k=3)"
"$BIN" generate --device cuda --model $M --prompt "$P" --max-tokens 48 --temperature 0 --json \
  --speculative-algorithm NEXTN --speculative-num-steps 3 | tee "$OUT/gen_mtp.json"
echo "== serve (cuda)"
"$BIN" serve --device cuda --model-path $M --port 30123 --state-dir "$OUT/state" \
  --speculative-algorithm NEXTN --speculative-num-steps 3 >"$OUT/serve.log" 2>&1 &
pid=$!
for _ in $(seq 1 120); do grep -q "listening on" "$OUT/serve.log" && break; sleep 0.5; done
curl -s localhost:30123/v1/chat/completions -H 'content-type: application/json' \
  -d '{"messages":[{"role":"user","content":"def quicksort(items):"}],"max_tokens":32,"temperature":0}' | tee "$OUT/chat.json"
echo
curl -s localhost:30123/v1/server_info; echo
curl -s localhost:30123/metrics | grep -E "^deltaserve_(requests_running|generation_tokens_total|spec_accept)" | head
kill $pid; wait $pid 2>/dev/null
echo "== bench-offline, 27B shape, dummy weights (engine path; decode batches replay CUDA graphs)"
"$BIN" bench-offline --device cuda --model bench/configs/qwen3.6-27b --load-format dummy \
  --batch 1,16 --threads 1 --prompt-len 16 --gen-len 32 --prefill-len 2048 | tee "$OUT/bench_offline_27b.txt"
