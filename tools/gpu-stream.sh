#!/usr/bin/env bash
# tools/gpu-stream.sh: on the device machine (no pack needed: nvcc builds the one bench there):
#   OUT=$OUT bash tools/gpu-stream.sh
# bench_cuda_stream (weights streamed under each read pattern, against the GEMV and cuBLAS at 1-16
# rows, rotating copies past the L2; STREAM_ARGS: its flags), then, where ncu reads counters
# (STREAM_NCU=0: skip), each launch's duration, DRAM throughput, grid, registers and shared memory
# for the shapes STREAM_NCU_SHAPES and patterns STREAM_NCU_PATTERNS, one call each (cold caches).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}
mkdir -p "$OUT"
cd "$ROOT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,power.draw,driver_version --format=csv >"$OUT/smi.txt"
BIN=$OUT/bench_cuda_stream
nvcc -O3 -std=c++17 -Isrc -gencode=arch=compute_90a,code=sm_90a -Xptxas -v bench/cuda/bench_cuda_stream.cu \
  src/backend/cuda/cuda_linear.cu -lcublas -lcublasLt -o "$BIN" >"$OUT/nvcc.log" 2>&1 || { tail -30 "$OUT/nvcc.log"; exit 1; }
timeout ${STREAM_TIMEOUT:-300} "$BIN" ${STREAM_ARGS:-} | tee "$OUT/stream.txt"
if [ "${STREAM_NCU:-1}" = 1 ]; then
  timeout 300 ncu --clock-control none --metrics \
gpu__time_duration.sum,dram__bytes_read.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,\
lts__t_sectors_srcunit_tex_op_read.sum,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,\
launch__grid_size,launch__block_size,launch__registers_per_thread,launch__shared_mem_per_block_dynamic,\
launch__shared_mem_per_block_static,l1tex__t_bytes_pipe_lsu_mem_global_op_ld.sum,\
smsp__inst_executed.sum,sm__throughput.avg.pct_of_peak_sustained_elapsed \
    "$BIN" --shapes "${STREAM_NCU_SHAPES:-34816x5120,5120x17408,5120x6144}" --iters 1 --patterns "${STREAM_NCU_PATTERNS:-2x2048x8,8x512x4}" \
    >"$OUT/ncu.txt" 2>&1
  echo "ncu rc=$?"
  grep -E "^  [a-z_]|gpu__time|dram__|lts__|sm__|launch__|l1tex|smsp" "$OUT/ncu.txt" | head -400 >"$OUT/ncu_short.txt"
  tail -5 "$OUT/ncu.txt"
fi
