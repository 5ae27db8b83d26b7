#!/usr/bin/env bash
# tools/gpu-engine-bench.sh: engine-level throughput on the Qwen3.6-27B shape (dummy bf16 weights)
# on a GPU machine: bench-offline at batch 1 / 16 / 64, greedy and with Qwen's sampling defaults
# (temperature 0.6, top-k 20, top-p 0.95), with the per-step time split (forward incl. logits to
# the host / sampling / drafts / other) that bench-offline prints.
#   BIN=path/to/deltaserve [OLD_BIN=path/to/older/deltaserve] tools/gpu-engine-bench.sh
# OLD_BIN, when given, runs the greedy case first with an older binary (side by side).
# Every run names its context: 1k-token prompts by default (PROMPT), then a batch-1 context sweep
# (CONTEXTS, default 1k / 8k / 32k / 128k) and 16 sequences at 8k, decode-only columns included.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BIN=${BIN:-$ROOT/build/src/app/deltaserve}
OUT=${OUT:-$ROOT/gpu-check-out}
BATCH=${BATCH:-1,16,64}
GEN=${GEN:-64}
PROMPT=${PROMPT:-1024}
CONTEXTS=${CONTEXTS:-1024,8192,32768,131072}
mkdir -p "$OUT"
cd "$ROOT"
M=bench/configs/qwen3.6-27b
common=(--device cuda --model $M --load-format dummy --batch "$BATCH" --threads 1 --prompt-len "$PROMPT" --gen-len "$GEN" --prefill-len 8192)
if [ -n "${OLD_BIN:-}" ]; then
  echo "== OLD binary, greedy"
  "$OLD_BIN" bench-offline "${common[@]}" 2>&1 | grep -v "^\[" | tee "$OUT/engine_old_greedy.txt"
fi
echo "== greedy"
"$BIN" bench-offline "${common[@]}" 2>&1 | grep -v "^\[" | tee "$OUT/engine_greedy.txt"
echo "== greedy, DELTASERVE_CUDA_GEMM=exact (f32-exact GEMMs above 8 rows; the default rounds to bf16)"
DELTASERVE_CUDA_GEMM=exact "$BIN" bench-offline "${common[@]}" 2>&1 | grep -v "^\[" | tee "$OUT/engine_greedy_exact.txt"
echo "== sampling (temperature 0.6, top-k 20, top-p 0.95)"
"$BIN" bench-offline "${common[@]}" --temperature 0.6 --top-k 20 --top-p 0.95 2>&1 | grep -v "^\[" | tee "$OUT/engine_sampling.txt"
echo "== MTP k=3, greedy, batch 1 and 16"
"$BIN" bench-offline --device cuda --model $M --load-format dummy --batch 1,16 --threads 1 --prompt-len "$PROMPT" \
  --gen-len "$GEN" --prefill-len 1024 --speculative-num-steps 3 2>&1 | grep -v "^\[" | tee "$OUT/engine_mtp.txt"
echo "== context sweep, batch 1 ($CONTEXTS tokens)"
"$BIN" bench-offline --device cuda --model $M --load-format dummy --batch 1 --threads 1 --prompt-len "$CONTEXTS" \
  --gen-len "$GEN" --prefill-len 1024 2>&1 | grep -v "^\[" | tee "$OUT/engine_context_sweep.txt"
echo "== 16 sequences at 8k"
"$BIN" bench-offline --device cuda --model $M --load-format dummy --batch 16 --threads 1 --prompt-len 8192 \
  --gen-len "$GEN" --prefill-len 1024 2>&1 | grep -v "^\[" | tee "$OUT/engine_16x8k.txt"
