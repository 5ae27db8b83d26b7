#!/usr/bin/env bash
# tools/gpu-run.sh: on the device machine, with the binaries tools/gpu-pack.sh packed:
#   STAGES="tests decode engine" OUT=$OUT bash tools/gpu-run.sh
# tests:  cuda_ops_test, cuda_model_test (KV dtypes, graphs), spec_rollback_test and step_memory_test on CUDA
#         (OPS_FILTER / MODEL_FILTER: gtest filters; TEST_TIMEOUT seconds each)
# decode: bench_cuda_decode on the 27B shape (dummy weights): batch 1 decode, verify + commit +
#         3 MTP steps, 8k TTFT, batch 16; once per KV dtype (KV_DTYPES, default "bf16 fp8_e4m3")
# engine: deltaserve bench-offline through the engine (scheduler, sampling, graphs): batch
#         1/16/64 at a 1k context, 8k prefill, and MTP k=3 at batch 1, per KV dtype
# tp:     tensor parallelism (tp model tests, bench_cuda_comm, bench-offline --tp-size 1 vs 2;
#         one GPU: both ranks on it)
# issue14: every figure of issue #14's table in one call (~3-4 minutes on an H200): batch 1 at 1k / 8k /
#         32k / 128k, 16 x 8k, 16 and 64 x 1k (after an 8k prefill: the 8k TTFT), Qwen's sampling at 128
#         (batch 16 / 64, f32 and bf16 GDN state), the MTP k=3 step, and 16 HTTP streams of 1k prompts;
#         then tools/issue14_table.py prints them beside the targets (logs in $OUT/i14); llama.cpp beside
#         them in a second call: tools/gpu-llama-pack.sh (its header has the command); I14_RUNS="b16_64_1k
#         sampled_f32 ..." runs only those (names: ctx b16_8k b16_64_1k sampled_f32 sampled_bf16 mtp http)
# longctx: bench-offline decode at long contexts (issue #14): batch 1 at 1k / 8k / 32k, batch 16
#         at 8k, batch 1 at 128k, with the split-KV decode kernel and (OLD_ATTN=1) with the tiled
#         kernel it replaced (DELTASERVE_CUDA_DECODE_ATTN=0); VARIANTS adds runs with other knobs
# sampling: bench-offline with Qwen's sampling settings (T 0.6, top-k 20, top-p 0.95) at a
#         128-token context, batch 1/16/64: --sampling-backend device, host, and greedy
# memfit: serve with only the plan's activation reserve (+1 GiB) outside the static budget, then
#         16k-token prompts: the reserve holds the largest step (model/step_memory.h)
# http:   serve + deltaserve bench, 16 streams of 1k-token prompts (greedy and temperature 0.6;
#         HTTP_TEMPS, HTTP_FLAGS: serve flags)
# http-variants: the same greedy run, a server per environment of VARIANTS ("name:VAR=val,..."), HTTP_ROUNDS
#         (2) times, alternating; prints each run's bench line and the server's warm-up line. A variant's
#         SERVE_FLAGS (comma-free, e.g. "skip:SERVE_FLAGS=--skip-server-warmup") are added to serve's flags
# mixed-steps: bench_cuda_decode --mixed-only, 15 decode rows beside chunks of MIXED_CHUNKS tokens
# mixed:  serve + deltaserve bench with Poisson arrivals, the prefill budget beside decodes auto / off
# dp:     serve --dp-size 2 against 1 (one GPU: both replicas on it), 64 streams, per-replica tokens
# prefill: 8k prefill, model only (bench_cuda_decode --prefill-only, op breakdown) with the GDN
#         recurrence on tensor cores (default) and on CUDA cores (DELTASERVE_CUDA_GDN=chunked), then
#         through the engine: TTFT at 8k and 32k (bench-offline --gen-len 8)
# attn:   bench_cuda_attention (the decode attention op alone, every kernel variant)
# matmul: bench_cuda_matmul (the 27B's matmuls alone at 1-64 rows: the GEMV, cuBLAS's default,
#         and the fastest algorithm cuBLASLt offers; MATMUL_ROWS, default 1,2,4,8,16,32,64;
#         MATMUL_OUT: f32 (default, as the backend calls it) or bf16 outputs)
# kernels: every kernel of an eager batch-1 decode step under ncu (cold caches, each kernel alone),
#         summed per kernel by tools/ncu_step.py: which small kernels a step waits on
# prefill-kernels: every kernel of bench_cuda_decode --prefill-only --prefill 8192 under ncu (a
#         512-token warm-up, then two 8k forwards), summed per kernel (tools/ncu_step.py --all)
# overlap: overlap scheduling (the next decode step launched before the last one's tokens are
#         read): overlap_schedule_test on CUDA, then bench-offline greedy batch 1/16/64 at a 1k
#         context with it (the default) and with --disable-overlap-schedule, twice, alternating
# sampled-overlap: Qwen's sampling drawn on the device (T 0.6, top-k 20, top-p 0.95), batch 16/64
#         (SAMPLED_BATCHES) at a 128-token context, overlap on and off, SAMPLED_ROUNDS (2) times,
#         alternating; then top-p 0.9 at T 1 (nuclei past the sampling kernel's window)
# ssm-bf16: greedy batch 1/16/64 (SSM_BATCHES) at a 1k context (SSM_PROMPT) with the GDN recurrent
#         state in f32 and in bf16 (--mamba-ssm-dtype), SSM_ROUNDS (2) times, alternating, under each
#         environment of SSM_ENVS; then Qwen's sampling at 128 with each
# tokenmap: MTP k=3 through the engine at batch 1 and 16 (TOKENMAP_BATCHES), without and with a
#         --speculative-token-map of 32768 ids spread over the vocabulary (every 7th),
#         TOKENMAP_ROUNDS times (default 2), alternating: the drafts' lm_head streams 32768 rows instead of 248k
# gdn-cluster: greedy batch 1/16/64 at a 1k context, then Qwen's sampling on the device at batch 16/64
#         at 128, through the engine, with the fused GDN decode kernel in clusters of each size of
#         GDN_CLUSTERS ("1 4": DELTASERVE_CUDA_GDN_CLUSTER), alternating
# variants: bench_cuda_decode (model only: batch 1 graph, verify(4), batch VAR_BATCH (16)) at a 1k
#         context with the new binaries under each environment of VARIANTS ("name:VAR=val,VAR=val";
#         "base:" for none) and, with .gpu/old.tar.xz, the old binaries as "old", VAR_ROUNDS (2)
#         times, alternating
# ncu-detail: full ncu sections for a few launches of chosen kernels (NCU_RUNS), see the stage
# engine-variants: greedy 1/16/64 at 1k, sampled 16/64 at 128 (and MTP) through the engine per VARIANTS env
# ab:     the same decode and engine benchmarks with an older build packed into .gpu/old.tar.xz
#         (its own flags: --model, f32 KV), for before/after figures from one session
# Logs and a summary go to $OUT.
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-out}
STAGES=${STAGES:-tests decode engine}
KV_DTYPES=${KV_DTYPES:-bf16 fp8_e4m3}
mkdir -p "$OUT" "$ROOT/.gpu/bin"
cd "$ROOT"
rm -rf .gpu/bin && mkdir -p .gpu/bin && tar -C .gpu/bin -xJf .gpu/bin.tar.xz || { echo "unpacking .gpu/bin.tar.xz failed"; exit 1; }
B=$ROOT/.gpu/bin
export LD_LIBRARY_PATH=$B/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
# The binaries find models/ and tests/fixtures/ under the source dir they were built from.
if [ "$ROOT" != /work/main ] && [ ! -e /work/main ]; then mkdir -p /work && ln -s "$ROOT" /work/main; fi
export NCCL_NVLS_ENABLE=0
# NCCL (loaded at run time by deltaserve): the device image has it in Python's nvidia-nccl package.
NCCL_LIB=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(os.path.dirname(nvidia.nccl.__file__), "lib"))' 2>/dev/null)
[ -n "$NCCL_LIB" ] && export LD_LIBRARY_PATH=$LD_LIBRARY_PATH:$NCCL_LIB
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,driver_version --format=csv >"$OUT/smi.txt"
echo "commit $(cat .gpu/commit 2>/dev/null) binaries $(md5sum <.gpu/bin.tar.xz | cut -c1-12)" | tee "$OUT/summary.txt"
M=bench/configs/qwen3.6-27b
has() { [[ " $STAGES " == *" $1 "* ]]; }
# serve_27b NAME PORT [flags...]: deltaserve serve on the 27B shape (dummy weights, Qwen3 tokenizer)
# in the background, logging to $OUT/serve_NAME.log; waits until it listens; SERVER_PID is its pid.
serve_27b() {
  local name=$1 port=$2
  shift 2
  "$B/deltaserve" serve --device cuda --model-path $M --load-format dummy --tokenizer-path tests/fixtures/tokenizer-qwen3 \
    --chat-template tests/fixtures/qwen3.6-chat_template.jinja --port "$port" --state-dir "$OUT/state" "$@" \
    >"$OUT/serve_$name.log" 2>&1 &
  SERVER_PID=$!
  for _ in $(seq 1 240); do grep -q "listening on" "$OUT/serve_$name.log" && break; sleep 0.5; done
}

if has tests; then
  for t in cuda_ops_test cuda_model_test; do
    f=${OPS_FILTER:-*}; [ $t = cuda_model_test ] && f=${MODEL_FILTER:-*}
    timeout ${TEST_TIMEOUT:-300} "$B/$t" --gtest_brief=1 --gtest_filter="$f" >"$OUT/$t.log" 2>&1
    echo "$t rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/$t.log" | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
  done
  timeout 120 "$B/spec_rollback_test" --gtest_filter='*cuda*' >"$OUT/spec_rollback.log" 2>&1
  echo "spec_rollback_test(cuda) rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/spec_rollback.log" | tr '\n' ' ')" |
    tee -a "$OUT/summary.txt"
  # The step buffers the plan reserves against what the CUDA engine allocated (model/step_memory.h).
  timeout 120 "$B/step_memory_test" --gtest_filter='*cuda*' >"$OUT/step_memory.log" 2>&1
  echo "step_memory_test(cuda) rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/step_memory.log" | tr '\n' ' ')" |
    tee -a "$OUT/summary.txt"
fi

if has issue14; then
  d=$OUT/i14
  mkdir -p "$d"
  i14() {  # name, bench-offline flags (I14_RUNS: the names to run, default all)
    local name=$1
    shift
    [ -n "${I14_RUNS:-}" ] && [[ " $I14_RUNS " != *" $name "* ]] && return 0
    timeout 300 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy --threads 1 "$@" \
      >"$d/$name.log" 2>&1
    echo "issue14 $name rc=$?" | tee -a "$OUT/summary.txt"
  }
  sampling=(--temperature 0.6 --top-k 20 --top-p 0.95 --sampling-backend device --batch 16,64 --prompt-len 128
    --gen-len 128 --prefill-len 1024)
  i14 ctx --batch 1 --prompt-len 1024,8192,32768,131072 --gen-len 64 --prefill-len 1024
  i14 b16_8k --batch 16 --prompt-len 8192 --gen-len 64 --prefill-len 1024
  i14 b16_64_1k --batch 16,64 --prompt-len 1024 --gen-len 96 --prefill-len 8192
  i14 sampled_f32 "${sampling[@]}"
  i14 sampled_bf16 "${sampling[@]}" --mamba-ssm-dtype bfloat16
  i14 mtp --speculative-algorithm NEXTN --speculative-num-steps 3 --batch 1 --prompt-len 1024 --gen-len 128 \
    --prefill-len 1024
  if [ -z "${I14_RUNS:-}" ] || [[ " $I14_RUNS " == *" http "* ]]; then
  serve_27b i14 30560 --context-length 8192 --max-running-requests 16
  timeout 300 "$B/deltaserve" bench --url http://127.0.0.1:30560 --concurrency 16 --input-len 1024 --output-len 128 \
    --num-prompts 64 --temperature 0 --no-record --output "$d/http.json" >"$d/http.txt" 2>&1
  echo "issue14 http rc=$?" | tee -a "$OUT/summary.txt"
  kill $SERVER_PID; wait $SERVER_PID 2>/dev/null
  fi
  python3 tools/issue14_table.py "$d" | tee -a "$OUT/summary.txt"
fi

if has overlap; then
  timeout 180 "$B/overlap_schedule_test" --gtest_filter='*cuda*' >"$OUT/overlap_test.log" 2>&1
  echo "overlap_schedule_test(cuda) rc=$? $(grep -E '^\[  (PASSED|FAILED|SKIPPED)' "$OUT/overlap_test.log" | tr '\n' ' ')" |
    tee -a "$OUT/summary.txt"
  for round in 1 2; do
    for mode in on off; do
      extra=""; [ $mode = off ] && extra="--disable-overlap-schedule"
      timeout 300 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy $extra \
        --batch ${OVERLAP_BATCHES:-1,16,64} --threads 1 --prompt-len 1024 --gen-len 96 --prefill-len 1024 \
        >"$OUT/overlap_${mode}_$round.log" 2>&1
      echo "bench-offline overlap=$mode round $round rc=$?" | tee -a "$OUT/summary.txt"
      grep -E '^(threads|[0-9])|decode step|overlap' "$OUT/overlap_${mode}_$round.log" | tee -a "$OUT/summary.txt"
    done
  done
fi

if has sampled-overlap; then  # Qwen's sampling on the device, chained (overlap on) or not, at a ~128-token context
  for round in $(seq 1 ${SAMPLED_ROUNDS:-2}); do
    for mode in on off; do
      extra=""; [ $mode = off ] && extra="--disable-overlap-schedule"
      timeout 300 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy $extra \
        --temperature 0.6 --top-k 20 --top-p 0.95 --sampling-backend device \
        --batch ${SAMPLED_BATCHES:-16,64} --threads 1 --prompt-len 128 --gen-len 128 --prefill-len 1024 \
        >"$OUT/sampled_${mode}_$round.log" 2>&1
      echo "bench-offline sampled overlap=$mode round $round rc=$?" | tee -a "$OUT/summary.txt"
      grep -E '^(threads|[0-9])|decode step|overlap|drawn' "$OUT/sampled_${mode}_$round.log" | tee -a "$OUT/summary.txt"
    done
  done
  # Top-p without top-k at temperature 1 over the dummy weights' flat rows: nuclei of thousands of
  # tokens, past the kernel's window (drawn over the whole row).
  timeout 300 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy \
    --temperature 1.0 --top-p 0.9 --sampling-backend device \
    --batch 1,16 --threads 1 --prompt-len 128 --gen-len 64 --prefill-len 1024 >"$OUT/sampled_wide.log" 2>&1
  echo "bench-offline sampled wide nuclei rc=$?" | tee -a "$OUT/summary.txt"
  grep -E '^(threads|[0-9])|decode step|overlap|drawn' "$OUT/sampled_wide.log" | tee -a "$OUT/summary.txt"
fi

if has ssm-bf16; then  # the GDN recurrent state in bf16 (--mamba-ssm-dtype bfloat16) against f32
  # SSM_ENVS: environment variants, each run with both dtypes (e.g. "DELTASERVE_CUDA_GDN_STAGE=0 DELTASERVE_CUDA_GDN_STAGE=1")
  for round in $(seq 1 ${SSM_ROUNDS:-2}); do
    for ev in ${SSM_ENVS:-DELTASERVE_NONE=0}; do
      for dt in float32 bfloat16; do
        env "$ev" timeout 300 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy --mamba-ssm-dtype $dt \
          --batch ${SSM_BATCHES:-1,16,64} --threads 1 --prompt-len ${SSM_PROMPT:-1024} --gen-len 96 --prefill-len 1024 \
          >"$OUT/ssm_${dt}_${ev}_$round.log" 2>&1
        echo "bench-offline greedy mamba-ssm-dtype=$dt $ev round $round rc=$?" | tee -a "$OUT/summary.txt"
        grep -E '^(threads|[0-9])|decode step|state slots' "$OUT/ssm_${dt}_${ev}_$round.log" | tee -a "$OUT/summary.txt"
      done
    done
  done
  for dt in float32 bfloat16; do
    timeout 300 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy --mamba-ssm-dtype $dt \
      --temperature 0.6 --top-k 20 --top-p 0.95 --sampling-backend device \
      --batch 16,64 --threads 1 --prompt-len 128 --gen-len 128 --prefill-len 1024 >"$OUT/ssm_sampled_$dt.log" 2>&1
    echo "bench-offline sampled mamba-ssm-dtype=$dt rc=$?" | tee -a "$OUT/summary.txt"
    grep -E '^(threads|[0-9])|decode step|overlap|drawn' "$OUT/ssm_sampled_$dt.log" | tee -a "$OUT/summary.txt"
  done
fi

if has tokenmap; then
  seq 0 7 229375 >"$OUT/map32k.txt"
  for round in $(seq 1 ${TOKENMAP_ROUNDS:-2}); do
    for mode in full map; do
      extra=""; [ $mode = map ] && extra="--speculative-token-map $OUT/map32k.txt"
      timeout 300 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy $extra \
        --speculative-algorithm NEXTN --speculative-num-steps 3 --batch ${TOKENMAP_BATCHES:-1,16} --threads 1 \
        --prompt-len 1024 --gen-len 128 --prefill-len 1024 >"$OUT/tokenmap_${mode}_$round.log" 2>&1
      echo "bench-offline MTP k=3 drafts=$mode round $round rc=$?" | tee -a "$OUT/summary.txt"
      grep -E '^(threads|[0-9])|decode step|accept|draft' "$OUT/tokenmap_${mode}_$round.log" | tee -a "$OUT/summary.txt"
    done
  done
fi

if has decode; then
  for kv in $KV_DTYPES; do
    timeout 240 "$B/bench_cuda_decode" --model $M --kv-dtype "$kv" --ctx 1024 --steps 64 --prefill 8192 --batch 16 \
      >"$OUT/decode_$kv.log" 2>&1
    echo "bench_cuda_decode kv=$kv rc=$?" | tee -a "$OUT/summary.txt"
    sed -n '/^| metric/,$p' "$OUT/decode_$kv.log" | tee -a "$OUT/summary.txt"
  done
fi

if has engine; then
  for kv in $KV_DTYPES; do
    timeout 300 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy --kv-cache-dtype "$kv" \
      --batch 1,16,64 --threads 1 --prompt-len 1024 --gen-len 96 --prefill-len 8192 >"$OUT/engine_$kv.log" 2>&1
    echo "bench-offline kv=$kv rc=$?" | tee -a "$OUT/summary.txt"
    grep -vE '^\[' "$OUT/engine_$kv.log" | tail -12 | tee -a "$OUT/summary.txt"
  done
  timeout 200 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy \
    --speculative-algorithm NEXTN --speculative-num-steps 3 --batch 1 --threads 1 --prompt-len 1024 --gen-len 128 \
    --prefill-len 1024 >"$OUT/engine_mtp.log" 2>&1
  echo "bench-offline MTP k=3 rc=$?" | tee -a "$OUT/summary.txt"
  grep -vE '^\[' "$OUT/engine_mtp.log" | tail -6 | tee -a "$OUT/summary.txt"
fi

if has sampling; then  # Qwen's sampling settings at a ~128-token context: device vs host sampling, and greedy
  for sb in device host greedy; do
    extra="--temperature 0.6 --top-k 20 --top-p 0.95 --sampling-backend $sb"
    [ $sb = greedy ] && extra=""
    timeout 300 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy $extra \
      --batch ${SAMPLING_BATCHES:-1,16,64} --threads 1 --prompt-len 128 --gen-len 128 --prefill-len 1024 \
      >"$OUT/sampling_$sb.log" 2>&1
    echo "bench-offline sampling=$sb rc=$?" | tee -a "$OUT/summary.txt"
    grep -vE '^\[' "$OUT/sampling_$sb.log" | tail -14 | tee -a "$OUT/summary.txt"
  done
fi

if has longctx; then
  lc() {  # name, timeout, env..., -- bench-offline flags
    local name=$1 to=$2; shift 2
    local envs=()
    while [ "$1" != -- ]; do envs+=("$1"); shift; done
    shift
    env "${envs[@]}" timeout "$to" "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy \
      --threads 1 --gen-len 64 --prefill-len "${PF:-1024}" "$@" >"$OUT/longctx_$name.log" 2>&1
    echo "longctx $name rc=$? $*" | tee -a "$OUT/summary.txt"
    grep -E '^(threads|[0-9])' "$OUT/longctx_$name.log" | tee -a "$OUT/summary.txt"
  }
  lc b1 150 DELTASERVE_CUDA_DECODE_ATTN=1 -- --batch 1 --prompt-len 1024,8192,32768
  lc b16 120 DELTASERVE_CUDA_DECODE_ATTN=1 -- --batch 16 --prompt-len 8192
  # issue #14's oddity: 16 x 8k decode at 611 ms a step when an 8k prefill ran first
  [ "${PF8K:-1}" = 1 ] && PF=8192 lc b16_pf8k 120 DELTASERVE_CUDA_DECODE_ATTN=1 -- --batch 16 --prompt-len 8192
  if [ "${OLD_ATTN:-1}" = 1 ]; then
    lc old_b1 90 DELTASERVE_CUDA_DECODE_ATTN=0 -- --batch 1 --prompt-len 32768
    lc old_b16 120 DELTASERVE_CUDA_DECODE_ATTN=0 -- --batch 16 --prompt-len 8192
  fi
  for v in ${VARIANTS:-}; do  # e.g. bps8:DELTASERVE_CUDA_DECODE_BLOCKS_PER_SM=8
    lc "${v%%:*}" 90 "${v#*:}" -- --batch 1 --prompt-len 32768
  done
  [ "${LONG128:-1}" = 1 ] && lc b1_128k 150 DELTASERVE_CUDA_DECODE_ATTN=1 -- --batch 1 --prompt-len 131072
fi

if has matmul; then
  timeout 300 "$B/bench_cuda_matmul" --rows "${MATMUL_ROWS:-1,2,4,8,16,32,64}" --out "${MATMUL_OUT:-f32}" \
    >"$OUT/matmul.log" 2>&1
  echo "bench_cuda_matmul rc=$?" | tee -a "$OUT/summary.txt"
  cat "$OUT/matmul.log" | tee -a "$OUT/summary.txt"
fi

# ncu_kernels NAME SECONDS STEP_FLAGS CMD...: every kernel of CMD under ncu (cold caches, each kernel
# alone) into $OUT/ncu_NAME.csv, summed per kernel by tools/ncu_step.py STEP_FLAGS.
ncu_kernels() {
  local name=$1 secs=$2 flags=$3
  shift 3
  local ncu
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  if [ -z "$ncu" ]; then
    echo "$name: no ncu on this machine" | tee -a "$OUT/summary.txt"
    return
  fi
  timeout "$secs" "$ncu" --clock-control none --csv --metrics gpu__time_duration.sum,launch__grid_size,launch__block_size \
    "$@" >"$OUT/ncu_$name.csv" 2>"$OUT/ncu_$name.err"
  echo "ncu $name rc=$?" | tee -a "$OUT/summary.txt"
  python3 tools/ncu_step.py "$OUT/ncu_$name.csv" $flags 2>&1 | head -60 | tee -a "$OUT/summary.txt"
}

# ncu-detail: full ncu sections (speed of light, memory, warp stalls by reason, occupancy) for a few
#         launches of the kernels named in NCU_RUNS ("name:batch:kernel-regex:skip:count ..."), from
#         bench-offline greedy decode at a 1k context (NCU_PROMPT) with no graphs; text reports in
#         $OUT/ncud_NAME.txt. Its warm-up decodes 7 steps at batch 1 first: skip 336 launches of a
#         once-a-layer kernel of the 27B's 48 GDN layers to reach the batch asked for.
if has ncu-detail; then
  ncu=$(command -v ncu || ls /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
  for run in ${NCU_RUNS:-gdn16:16:gdn_decode_kernel:432:1}; do
    IFS=: read -r name batch kre skip count <<<"$run"
    [ -z "$ncu" ] && { echo "ncu-detail: no ncu on this machine" | tee -a "$OUT/summary.txt"; break; }
    timeout 240 "$ncu" --clock-control none --set full --import-source no -k "regex:$kre" --launch-skip "$skip" \
      --launch-count "$count" --metrics 'regex:smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio' \
      "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy --threads 1 \
      --batch "$batch" --prompt-len "${NCU_PROMPT:-1024}" --gen-len 8 --prefill-len 1024 --disable-cuda-graph \
      ${NCU_FLAGS:-} >"$OUT/ncud_$name.txt" 2>"$OUT/ncud_$name.err"
    echo "ncu-detail $name rc=$?" | tee -a "$OUT/summary.txt"
    grep -E "^  [a-z_]+.*\(|Duration|DRAM Throughput|Achieved Occupancy|Registers Per|Theoretical Occ|Waves Per SM|Warp Cycles Per Issued|Issue Active|stalled_(long|short|barrier|wait|mio|lg|math|no_inst)" \
      "$OUT/ncud_$name.txt" | head -80 | tee -a "$OUT/summary.txt"
  done
fi

if has kernels; then
  ncu_kernels decode 300 "" "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy --batch 1 \
    --prompt-len 64 --gen-len 4 --prefill-len 64 --disable-cuda-graph
fi

if has prefill-kernels; then
  ncu_kernels prefill 400 --all "$B/bench_cuda_decode" --model $M --kv-dtype bf16 --prefill-only --prefill 8192
fi

if has prefill; then
  for v in ${PREFILL_VARIANTS:-mma:DELTASERVE_CUDA_GDN=mma chunked:DELTASERVE_CUDA_GDN=chunked}; do
    env "${v#*:}" timeout 200 "$B/bench_cuda_decode" --model $M --kv-dtype bf16 --prefill-only --prefill 8192 \
      >"$OUT/prefill_${v%%:*}.log" 2>&1
    echo "bench_cuda_decode --prefill-only ${v%%:*} rc=$?" | tee -a "$OUT/summary.txt"
    grep -iE "ttft|prefill|gated_delta|matmul|attention|silu|norm" "$OUT/prefill_${v%%:*}.log" | head -20 |
      tee -a "$OUT/summary.txt"
  done
  timeout 240 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy --batch 1 --threads 1 \
    --prompt-len 8192,32768 --gen-len 8 --prefill-len 8192 >"$OUT/prefill_engine.log" 2>&1
  echo "bench-offline prefill rc=$?" | tee -a "$OUT/summary.txt"
  grep -vE '^\[' "$OUT/prefill_engine.log" | tail -10 | tee -a "$OUT/summary.txt"
fi

# prefill-variants: the 8k prefill under each environment of VARIANTS ("name:VAR=val,..."), PV_ROUNDS (2)
#         times, alternating: model only (bench_cuda_decode --prefill-only --prefill 8192: the TTFT after
#         a warm-up forward of 8k, and the op breakdown) and through the engine (bench-offline --batch 1
#         --prompt-len PV_PROMPTS (8192) --gen-len 8 --prefill-len 8192; TTFT = steps x per step minus
#         the decode steps); then the GEMM algorithms each variant chose at prefill row counts
if has prefill-variants; then
  for round in $(seq 1 ${PV_ROUNDS:-2}); do
    for v in ${VARIANTS:-base:}; do
      name=${v%%:*}; envs=${v#*:}; log=$OUT/pv_${name}_$round
      env ${envs//,/ } timeout 200 "$B/bench_cuda_decode" --model $M --kv-dtype bf16 --prefill-only --prefill 8192 \
        >"$log.model.log" 2>&1
      echo "prefill variant $name ($envs) round $round model rc=$?: $(grep -E '^TTFT' "$log.model.log")" |
        tee -a "$OUT/summary.txt"
      grep -E "^  matmul" "$log.model.log" | head -7 | tee -a "$OUT/summary.txt"
      env ${envs//,/ } timeout 240 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy \
        --batch 1 --threads 1 --prompt-len ${PV_PROMPTS:-8192} --gen-len 8 --prefill-len 8192 >"$log.engine.log" 2>&1
      echo "prefill variant $name round $round engine rc=$?:" | tee -a "$OUT/summary.txt"
      grep -E '^[0-9]|batch 1: ' "$log.engine.log" | tee -a "$OUT/summary.txt"
    done
  done
  for v in ${VARIANTS:-base:}; do
    echo "GEMM choices at prefill rows, ${v%%:*}:" | tee -a "$OUT/summary.txt"
    grep -E 'rows [0-9]{3,}' "$OUT/pv_${v%%:*}_1.model.log" | tee -a "$OUT/summary.txt"
  done
fi

# attn: the decode attention op alone (bench_cuda_attention): every kernel variant at 1k-128k,
#       batch 1 and 16, bf16; 4-row verification; fp8 (ATTN_CTX overrides the contexts)
# mixed-steps: bench_cuda_decode --mixed-only: one continuous-batching step of 15 decode rows and a
# prefill chunk of each size of MIXED_CHUNKS, against each part alone, at each context of MIXED_CTX
if has mixed-steps; then
  for c in ${MIXED_CTX:-1024}; do
    timeout 300 "$B/bench_cuda_decode" --model $M --kv-dtype bf16 --ctx "$c" --batch 16 --steps 8 \
      --prefill $((c + 18 * 520 + 64)) --mixed "${MIXED_CHUNKS:-49,50,113,114,128,241,242,497,498}" --mixed-only \
      >"$OUT/mixed_steps_$c.log" 2>&1
    echo "bench_cuda_decode --mixed-only ctx $c rc=$?" | tee -a "$OUT/summary.txt"
    grep -E '^\| mixed step' "$OUT/mixed_steps_$c.log" | tee -a "$OUT/summary.txt"
  done
fi

if has attn; then
  A=${ATTN_CTX:-1024,8192,32768,131072}
  for spec in "bf16:--batch 1,16" "rows4:--batch 1,16 --rows 4" "fp8:--batch 1,16 --kv fp8"; do
    timeout 200 "$B/bench_cuda_attention" --ctx "$A" ${spec#*:} >"$OUT/attn_${spec%%:*}.log" 2>&1
    echo "bench_cuda_attention ${spec%%:*} rc=$?" | tee -a "$OUT/summary.txt"
    cat "$OUT/attn_${spec%%:*}.log" >>"$OUT/summary.txt"
  done
fi

# tp: tensor parallelism through CudaPeerCommunicator (issue #12). With one GPU every rank
# shares it (DELTASERVE_TP_DEVICES=0,0): correctness and the collectives' cost, not a speed-up.
if has tp; then
  NG=$(nvidia-smi -L | wc -l)
  TPD=${TP_DEVICES:-}; [ -z "$TPD" ] && [ "$NG" -lt 2 ] && TPD=0,0
  if ! has tests; then  # (the tests stage runs every cuda_model_test case, these included)
    timeout ${TEST_TIMEOUT:-300} "$B/cuda_model_test" --gtest_brief=1 --gtest_filter='*_tp*' >"$OUT/tp_model_test.log" 2>&1
    echo "cuda_model_test(tp) rc=$? $(grep -E '^\[  (PASSED|FAILED)' "$OUT/tp_model_test.log" | tr '\n' ' ')" | tee -a "$OUT/summary.txt"
  fi
  DELTASERVE_TP_DEVICES=$TPD timeout 120 "$B/bench_cuda_comm" --ranks 2 >"$OUT/tp_comm.log" 2>&1
  echo "bench_cuda_comm rc=$? devices=${TPD:-0,1}" | tee -a "$OUT/summary.txt"
  grep -E '^(peer|\|)' "$OUT/tp_comm.log" | tee -a "$OUT/summary.txt"
  # NCCL: one GPU per rank (one GPU: a single rank, which checks loading, init, graphs and sums).
  NR=2; [ "$NG" -lt 2 ] && NR=1
  timeout 120 "$B/bench_cuda_comm" --nccl --ranks $NR >"$OUT/tp_comm_nccl.log" 2>&1
  echo "bench_cuda_comm --nccl rc=$? ranks=$NR" | tee -a "$OUT/summary.txt"
  grep -E '^(NCCL|\|)' "$OUT/tp_comm_nccl.log" | tee -a "$OUT/summary.txt"
  [ -s "$OUT/tp_comm_nccl.log" ] && tail -n 3 "$OUT/tp_comm_nccl.log" >>"$OUT/summary.txt"
  # The multi-node path (unique id, ncclCommInitRank), every rank in this process.
  timeout 120 "$B/bench_cuda_comm" --nccl-id --ranks $NR >"$OUT/tp_comm_nccl_id.log" 2>&1
  echo "bench_cuda_comm --nccl-id rc=$? ranks=$NR" | tee -a "$OUT/summary.txt"
  grep -E '^(NCCL|\|)' "$OUT/tp_comm_nccl_id.log" | tee -a "$OUT/summary.txt"
  for tp in 1 2; do
    # Ranks sharing one GPU each plan for a whole GPU: give each under half of it.
    frac=(); [ $tp = 2 ] && [ -n "$TPD" ] && frac=(--mem-fraction-static 0.40)
    DELTASERVE_TP_DEVICES=$([ $tp = 2 ] && echo "$TPD") timeout 240 "$B/deltaserve" bench-offline --device cuda \
      --model-path $M --load-format dummy --tp-size $tp --batch 1,16 --threads 1 --prompt-len 1024 --gen-len 64 \
      --prefill-len 8192 "${frac[@]}" >"$OUT/tp_engine_tp$tp.log" 2>&1
    echo "bench-offline --tp-size $tp rc=$?" | tee -a "$OUT/summary.txt"
    grep -E '^(threads|[0-9]|engine:)' "$OUT/tp_engine_tp$tp.log" | tee -a "$OUT/summary.txt"
  done
fi

if has gdn-cluster; then
  for cl in ${GDN_CLUSTERS:-1 4}; do
    DELTASERVE_CUDA_GDN_CLUSTER=$cl timeout 300 "$B/deltaserve" bench-offline --device cuda --model-path $M \
      --load-format dummy --batch 1,16,64 --threads 1 --prompt-len 1024 --gen-len 96 --prefill-len 1024 \
      >"$OUT/cluster_${cl}_greedy.log" 2>&1
    echo "bench-offline greedy GDN cluster $cl rc=$?" | tee -a "$OUT/summary.txt"
    grep -E '^(threads|[0-9])|decode step' "$OUT/cluster_${cl}_greedy.log" | tee -a "$OUT/summary.txt"
  done
  for cl in ${GDN_CLUSTERS:-1 4}; do
    DELTASERVE_CUDA_GDN_CLUSTER=$cl timeout 300 "$B/deltaserve" bench-offline --device cuda --model-path $M \
      --load-format dummy --temperature 0.6 --top-k 20 --top-p 0.95 --sampling-backend device --batch 16,64 \
      --threads 1 --prompt-len 128 --gen-len 128 --prefill-len 1024 >"$OUT/cluster_${cl}_sampled.log" 2>&1
    echo "bench-offline sampled GDN cluster $cl rc=$?" | tee -a "$OUT/summary.txt"
    grep -E '^(threads|[0-9])|decode step' "$OUT/cluster_${cl}_sampled.log" | tee -a "$OUT/summary.txt"
  done
fi

if has variants; then
  if [ -f .gpu/old.tar.xz ]; then mkdir -p .gpu/old && tar -C .gpu/old -xJf .gpu/old.tar.xz; fi
  for round in $(seq 1 ${VAR_ROUNDS:-2}); do
    for v in $([ -f .gpu/old.tar.xz ] && echo old:) ${VARIANTS:-base:}; do
      name=${v%%:*}; envs=${v#*:}; bin=$B; lib=$B/lib
      [ "$name" = old ] && bin=$ROOT/.gpu/old && lib=$bin/lib
      log=$OUT/var_${name}_$round.log
      env ${envs//,/ } LD_LIBRARY_PATH=$lib:$LD_LIBRARY_PATH timeout 200 "$bin/bench_cuda_decode" --model $M \
        --kv-dtype bf16 --ctx 1024 --steps 32 --prefill 0 --batch ${VAR_BATCH:-16} >"$log" 2>&1
      rc=$?
      echo "variant $name ($envs) round $round rc=$rc: $(grep -oE '[0-9.]+ tok/s|verify forward[^;]*' "$log" |
        tr '\n' ' ')" | tee -a "$OUT/summary.txt"
    done
  done
fi

# engine-variants: through the engine under each environment of VARIANTS, EV_ROUNDS (2) times,
#         alternating: greedy decode at EV_BATCHES (1,16,64) at a 1k context; Qwen's sampling on the
#         device at EV_SAMPLED (16,64) at 128 ("" skips); MTP k=3 at EV_MTP_BATCHES (1) with EV_MTP=1.
#         A variant named "old" runs the deltaserve packed into .gpu/old.tar.xz (tools/gpu-pack.sh's
#         binary of an older tree), under its environment. A variant's DS_FLAGS (e.g.
#         "b16:DS_FLAGS=--mamba-ssm-dtype=bfloat16"; repeat it for more) are added to bench-offline's flags.
if has engine-variants; then
  if [[ " ${VARIANTS:-} " == *" old:"* ]] && [ -f .gpu/old.tar.xz ]; then
    mkdir -p .gpu/old && tar -C .gpu/old -xJf .gpu/old.tar.xz
  fi
  for round in $(seq 1 ${EV_ROUNDS:-2}); do
    for v in ${VARIANTS:-base:}; do
      name=${v%%:*}; envs=${v#*:}; ev=; flags=
      for kv in ${envs//,/ }; do
        case $kv in DS_FLAGS=*) flags="$flags ${kv#DS_FLAGS=}" ;; *) ev="$ev $kv" ;; esac
      done
      log=$OUT/ev_${name}_$round
      DS=$B/deltaserve
      [ "$name" = old ] && DS=$ROOT/.gpu/old/deltaserve
      env $ev timeout 300 "$DS" bench-offline --device cuda --model-path $M --load-format dummy \
        --batch ${EV_BATCHES:-1,16,64} --threads 1 --prompt-len 1024 --gen-len 96 --prefill-len 1024 $flags >"$log.greedy" 2>&1
      echo "engine variant $name ($envs) round $round greedy rc=$?" | tee -a "$OUT/summary.txt"
      grep -E '^[0-9]|decode step' "$log.greedy" | tee -a "$OUT/summary.txt"
      if [ -n "${EV_SAMPLED-16,64}" ]; then
        env $ev timeout 300 "$DS" bench-offline --device cuda --model-path $M --load-format dummy \
          --temperature 0.6 --top-k 20 --top-p 0.95 --sampling-backend device --batch ${EV_SAMPLED-16,64} --threads 1 \
          --prompt-len 128 --gen-len 128 --prefill-len 1024 $flags >"$log.sampled" 2>&1
        echo "engine variant $name ($envs) round $round sampled rc=$?" | tee -a "$OUT/summary.txt"
        grep -E '^[0-9]|decode step' "$log.sampled" | tee -a "$OUT/summary.txt"
      fi
      if [ "${EV_MTP:-0}" = 1 ]; then
        env $ev timeout 200 "$DS" bench-offline --device cuda --model-path $M --load-format dummy \
          --speculative-algorithm NEXTN --speculative-num-steps 3 --batch ${EV_MTP_BATCHES:-1} --threads 1 --prompt-len 1024 \
          --gen-len 128 --prefill-len 1024 $flags >"$log.mtp" 2>&1
        echo "engine variant $name ($envs) round $round MTP k=3 rc=$?" | tee -a "$OUT/summary.txt"
        grep -E '^[0-9]|decode step' "$log.mtp" | tee -a "$OUT/summary.txt"
      fi
    done
  done
fi

if has ab && [ -f .gpu/old.tar.xz ]; then
  mkdir -p .gpu/old && tar -C .gpu/old -xJf .gpu/old.tar.xz
  O=$ROOT/.gpu/old
  LD_LIBRARY_PATH=$O/lib timeout 240 "$O/bench_cuda_decode" --model $M --ctx 1024 --steps 64 --prefill 8192 --batch 16 \
    >"$OUT/old_decode.log" 2>&1
  echo "OLD bench_cuda_decode rc=$?" | tee -a "$OUT/summary.txt"
  sed -n '/^| metric/,$p' "$OUT/old_decode.log" | tee -a "$OUT/summary.txt"
  timeout 240 "$B/bench_cuda_decode" --model $M --kv-dtype f32 --ctx 1024 --steps 64 --prefill 8192 --batch 16 \
    >"$OUT/decode_f32.log" 2>&1
  echo "NEW bench_cuda_decode kv=f32 rc=$?" | tee -a "$OUT/summary.txt"
  sed -n '/^| metric/,$p' "$OUT/decode_f32.log" | tee -a "$OUT/summary.txt"
  LD_LIBRARY_PATH=$O/lib timeout 300 "$O/deltaserve" bench-offline --device cuda --model $M --load-format dummy \
    --batch 1,16,64 --threads 1 --prompt-len 1024 --gen-len 128 --prefill-len 8192 >"$OUT/old_engine.log" 2>&1
  echo "OLD bench-offline rc=$?" | tee -a "$OUT/summary.txt"
  grep -vE '^\[' "$OUT/old_engine.log" | tail -8 | tee -a "$OUT/summary.txt"
  LD_LIBRARY_PATH=$O/lib timeout 200 "$O/deltaserve" bench-offline --device cuda --model $M --load-format dummy \
    --speculative-num-steps 3 --batch 1 --threads 1 --prompt-len 1024 --gen-len 128 --prefill-len 1024 \
    >"$OUT/old_engine_mtp.log" 2>&1
  echo "OLD bench-offline MTP k=3 rc=$?" | tee -a "$OUT/summary.txt"
  grep -vE '^\[' "$OUT/old_engine_mtp.log" | tail -4 | tee -a "$OUT/summary.txt"
  timeout 200 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy \
    --speculative-num-steps 3 --batch 1 --threads 1 --prompt-len 1024 --gen-len 128 --prefill-len 1024 \
    >"$OUT/new_engine_mtp.log" 2>&1
  echo "NEW bench-offline MTP k=3 rc=$?" | tee -a "$OUT/summary.txt"
  grep -vE '^\[' "$OUT/new_engine_mtp.log" | tail -4 | tee -a "$OUT/summary.txt"
  for kv in $KV_DTYPES; do
    timeout 300 "$B/deltaserve" bench-offline --device cuda --model-path $M --load-format dummy --kv-cache-dtype "$kv" \
      --batch 1,16,64 --threads 1 --prompt-len 1024 --gen-len 128 --prefill-len 8192 >"$OUT/new_engine_$kv.log" 2>&1
    echo "NEW bench-offline kv=$kv rc=$?" | tee -a "$OUT/summary.txt"
    grep -vE '^\[' "$OUT/new_engine_$kv.log" | tail -8 | tee -a "$OUT/summary.txt"
  done
fi

# dp: data parallelism on GPUs through serve: --dp-size 2 (a GPU per replica; with one GPU both
# replicas share it, each planned for 0.45 of it) against one replica, 64 streams of 1k-token
# prompts; /metrics shows each replica's share.
if has dp; then
  NG=$(nvidia-smi -L | wc -l)
  DPD=${DP_DEVICES:-}; [ -z "$DPD" ] && [ "$NG" -lt 2 ] && DPD=0,0
  for dp in 1 2; do
    DELTASERVE_TP_DEVICES=$([ $dp = 2 ] && echo "$DPD") serve_27b "dp$dp" 30558 --dp-size $dp --context-length 8192 \
      --max-running-requests 32 --mem-fraction-static 0.45
    timeout 300 "$B/deltaserve" bench --url http://127.0.0.1:30558 --concurrency 64 --input-len 1024 --output-len 128 \
      --num-prompts ${DP_PROMPTS:-128} --temperature 0 --no-record --output "$OUT/dp$dp.json" >"$OUT/dp$dp.txt" 2>&1
    rc=$?
    echo "dp $dp (GPUs $([ $dp = 2 ] && echo "${DPD:-0,1}" || echo 0)) bench rc=$rc" | tee -a "$OUT/summary.txt"
    tail -8 "$OUT/dp$dp.txt" | tee -a "$OUT/summary.txt"
    curl -s http://127.0.0.1:30558/metrics | grep -E '^deltaserve_(replica_)?generation_tokens_total' | tee -a "$OUT/summary.txt"
    kill $SERVER_PID; wait $SERVER_PID 2>/dev/null
  done
fi

# prefix: the multi-turn agent workload against serve (27B shape, dummy weights, the Qwen3
# tokenizer), with and without the prefix cache (issue #13).
if has prefix; then
  for mode in cache nocache; do
    extra=()
    [ "$mode" = nocache ] && extra=(--disable-radix-cache)
    serve_27b "$mode" 30555 --context-length 32768 --max-running-requests 16 "${extra[@]}"
    timeout 300 "$B/deltaserve" bench --multi-turn --url http://127.0.0.1:30555 --conversations 4 --turns 12 \
      --system-len ${SYSTEM_LEN:-6000} --turn-len ${TURN_LEN:-150} --output-len 64 --output "$OUT/multiturn_$mode.json" \
      >"$OUT/multiturn_$mode.txt" 2>&1
    echo "multi-turn $mode rc=$?" | tee -a "$OUT/summary.txt"
    grep -vE '^  turn' "$OUT/multiturn_$mode.txt" | tee -a "$OUT/summary.txt"
    kill $SERVER_PID; wait $SERVER_PID 2>/dev/null
  done
fi

if has http-variants; then
  for round in $(seq 1 ${HTTP_ROUNDS:-2}); do
    for v in ${VARIANTS:-base:}; do
      name=${v%%:*}; envs=${v#*:}
      (
        for kv in ${envs//,/ }; do export "$kv"; done
        serve_27b "hv_${name}_$round" 30558 --context-length 8192 --max-running-requests 16 ${HTTP_FLAGS:-} \
          ${SERVE_FLAGS:-}
        timeout 300 "$B/deltaserve" bench --url http://127.0.0.1:30558 --concurrency ${HTTP_CONCURRENCY:-16} \
          --input-len 1024 --output-len 128 --num-prompts ${HTTP_PROMPTS:-64} --temperature 0 --no-record \
          >"$OUT/hv_${name}_$round.txt" 2>&1
        echo "http variant $name ($envs) round $round rc=$?: $(grep -E '^ +[0-9]+ +[0-9]+ +[0-9]+ ' \
          "$OUT/hv_${name}_$round.txt")" | tee -a "$OUT/summary.txt"
        grep -h 'warm-up' "$OUT/serve_hv_${name}_$round.log" | tee -a "$OUT/summary.txt"
        kill $SERVER_PID; wait $SERVER_PID 2>/dev/null
      )
    done
  done
fi

# memfit: the plan's activation reserve against the GPU (model/step_memory.h): serve with
# --mem-fraction-static leaving only the reserve + MEMFIT_MARGIN_MIB (1024) outside the static
# budget (a context of 131,072 x 16 requests: the KV fills the budget), then prompts of 16k tokens
# (steps of the whole prefill budget beside decodes; MEMFIT_FLAGS: more plan and serve flags); no
# allocation may fail. Prints /get_server_info's memory and the GPU's memory in use.
if has memfit; then
  total=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits | head -1)  # MiB
  reserve=$("$B/deltaserve" plan --model-path $M --gpu-memory "${total}MiB" --context-length 131072 \
    --max-running-requests 16 ${MEMFIT_FLAGS:-} --json 2>/dev/null | grep -o '"activation_reserve_bytes": *[0-9]*' | grep -o '[0-9]*$')
  frac=$(awk -v r="$reserve" -v t="$total" -v m="${MEMFIT_MARGIN_MIB:-1024}" 'BEGIN { printf "%.3f", 1 - (r / 1048576 + m) / t }')
  echo "memfit: GPU ${total} MiB, plan reserve $reserve B, --mem-fraction-static $frac" | tee -a "$OUT/summary.txt"
  serve_27b memfit 30559 --context-length 131072 --max-running-requests 16 --mem-fraction-static "$frac" ${MEMFIT_FLAGS:-}
  timeout 300 "$B/deltaserve" bench --url http://127.0.0.1:30559 --concurrency 4 --input-len 16000 --output-len 32 \
    --num-prompts 8 --temperature 0 --no-record >"$OUT/memfit_bench.txt" 2>&1
  echo "memfit bench rc=$?: $(grep -E '^ +[0-9]+ +[0-9]+ +[0-9]+ ' "$OUT/memfit_bench.txt")" | tee -a "$OUT/summary.txt"
  exec 3<>/dev/tcp/127.0.0.1/30559 && printf 'GET /get_server_info HTTP/1.0\r\n\r\n' >&3 &&
    tr ',' '\n' <&3 | grep -E 'bytes' | tee -a "$OUT/summary.txt"
  exec 3<&-
  nvidia-smi --query-gpu=memory.used,memory.total --format=csv | tee -a "$OUT/summary.txt"
  grep -iE 'out of memory|cudaMalloc|failed|error' "$OUT/serve_memfit.log" | head -5 | tee -a "$OUT/summary.txt"
  kill $SERVER_PID; wait $SERVER_PID 2>/dev/null
fi

# http: serve + `deltaserve bench` over HTTP, 1k-token prompts, 128 output tokens, 16 streams
# (issue #14's 800 tok/s / TTFT p50 1 s target), greedy and at temperature 0.6.
if has http; then
  serve_27b http 30557 --context-length 8192 --max-running-requests 16 ${HTTP_FLAGS:-}
  for temp in ${HTTP_TEMPS:-0 0.6}; do
    timeout 300 "$B/deltaserve" bench --url http://127.0.0.1:30557 --concurrency ${HTTP_CONCURRENCY:-16} \
      --input-len 1024 --output-len 128 --num-prompts ${HTTP_PROMPTS:-64} --temperature $temp --no-record \
      --output "$OUT/http_t$temp.json" >"$OUT/http_t$temp.txt" 2>&1
    echo "http bench temperature $temp rc=$?" | tee -a "$OUT/summary.txt"
    tail -8 "$OUT/http_t$temp.txt" | tee -a "$OUT/summary.txt"
  done
  kill $SERVER_PID; wait $SERVER_PID 2>/dev/null
fi

# mixed: prompts arriving while other requests decode (issue #14: ITL p99 within 3x p50). serve
# with the prefill budget beside decodes on auto (from step times) and off (--mixed-prefill-tokens
# 16384, the whole step budget), then `deltaserve bench` with Poisson arrivals (MIXED_RATE req/s,
# at most 16 in flight, MIXED_INPUT-word prompts, MIXED_OUTPUT tokens each).
if has mixed; then
  for mode in ${MIXED_MODES:-auto off}; do
    flags=""
    [ "$mode" = off ] && flags="--mixed-prefill-tokens 16384"
    serve_27b mixed_$mode 30559 --context-length 16384 --max-running-requests 16 $flags
    timeout 240 "$B/deltaserve" bench --url http://127.0.0.1:30559 --concurrency 16 --input-len ${MIXED_INPUT:-2048} \
      --output-len ${MIXED_OUTPUT:-256} --num-prompts ${MIXED_PROMPTS:-48} --request-rate ${MIXED_RATE:-2} \
      --temperature 0 --seed 3 --no-record --output "$OUT/mixed_$mode.json" >"$OUT/mixed_$mode.txt" 2>&1
    echo "mixed $mode rc=$?" | tee -a "$OUT/summary.txt"
    grep -A1 "conc " "$OUT/mixed_$mode.txt" | tee -a "$OUT/summary.txt"
    curl -s http://127.0.0.1:30559/metrics | grep -E '^deltaserve_mixed_prefill_tokens' | tee -a "$OUT/summary.txt"
    kill $SERVER_PID; wait $SERVER_PID 2>/dev/null
  done
fi

# grammar: the per-step cost of a grammar constraint at 16 concurrent streams (issue #15),
# through serve on the 27B shape (Qwen3 tokenizer: the 151k vocabulary the masks cover).
if has grammar; then
  serve_27b grammar 30556 --context-length 8192 --max-running-requests 16
  timeout 300 python3 bench/grammar/serve_overhead.py --url http://127.0.0.1:30556 --concurrency 16 --max-tokens 128 \
    --rounds 3 2>&1 | tee -a "$OUT/summary.txt"
  kill $SERVER_PID; wait $SERVER_PID 2>/dev/null
fi
