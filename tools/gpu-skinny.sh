#!/usr/bin/env bash
# tools/gpu-skinny.sh: on the device machine (no pack needed: nvcc builds the one bench there):
#   OUT=$OUT bash tools/gpu-skinny.sh
# bench_cuda_skinny: the tensor-core matmul of 2-16 rows in the GEMV's block shape, checked against
# cublasGemmEx and timed beside it and the one-row GEMV (SKINNY_ARGS: its flags).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
cd "$ROOT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,driver_version --format=csv >"$OUT/smi.txt"
BIN=$OUT/bench_cuda_skinny
nvcc -O3 -std=c++17 -Isrc -Ibench/cuda -gencode=arch=compute_90a,code=sm_90a -Xptxas -v bench/cuda/bench_cuda_skinny.cu \
  src/backend/cuda/cuda_linear.cu -lcublas -o "$BIN" >"$OUT/nvcc.log" 2>&1 || { tail -30 "$OUT/nvcc.log"; exit 1; }
timeout ${SKINNY_TIMEOUT:-300} "$BIN" ${SKINNY_ARGS:-} | tee "$OUT/skinny.txt"
