#!/usr/bin/env bash
# Builds the libFuzzer targets (tests/fuzz, clang + ASan/UBSan) into build-fuzz/ and runs each.
#   tools/fuzz.sh                 8 s per target (the CI smoke)
#   tools/fuzz.sh 60              60 s per target
#   tools/fuzz.sh --runs 1000000  10^6 executions per target
#   tools/fuzz.sh --runs 1000 fuzz_jinja fuzz_tokenizer   only these targets
# Each target starts from its seeds in tests/fuzz/corpus/<name>/ (never written to); the growing
# corpus lives in build-fuzz/corpus/<name>/, crashes/leaks/timeouts in build-fuzz/findings/<name>/.
# Prints per target: executions, exec/s, findings; exits 1 if any target found something.
# Env: BUILD_DIR (build-fuzz), JOBS (build jobs, 2), MAX_LEN (4096), FUZZ_TIMEOUT (s per input, 60:
# on a loaded machine a short limit reports CPU starvation as a timeout), FUZZ_FLAGS (extra flags).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build-fuzz}"
mode=time; amount=8
if [ "${1:-}" = "--runs" ]; then mode=runs; amount="${2:?--runs needs a count}"; shift 2
elif [ -n "${1:-}" ] && [[ "$1" =~ ^[0-9]+$ ]]; then amount="$1"; shift; fi
ALL=(fuzz_http_request fuzz_openai_request fuzz_jinja fuzz_tokenizer fuzz_safetensors fuzz_model_config
     fuzz_reasoning_parser fuzz_tool_call_parser fuzz_grammar)
targets=("$@"); [ ${#targets[@]} -eq 0 ] && targets=("${ALL[@]}")

CLANG_CC="${CLANG_CC:-clang-16}"; CLANG_CXX="${CLANG_CXX:-clang++-16}"
if ! command -v "$CLANG_CXX" >/dev/null || [ ! -d /usr/lib/llvm-16/lib/clang/16/lib/linux ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "fuzz: installing clang-16 libclang-rt-16-dev"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq clang-16 libclang-rt-16-dev
fi
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  CC="$CLANG_CC" CXX="$CLANG_CXX" cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DDELTASERVE_FUZZ=ON -DDELTASERVE_CUDA=OFF >/dev/null
fi
cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target "${targets[@]}"

export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
status=0
printf '%-24s %12s %10s %9s %s\n' target executions exec/s findings seconds
for t in "${targets[@]}"; do
  name="${t#fuzz_}"
  corpus="$BUILD_DIR/corpus/$name"; findings="$BUILD_DIR/findings/$name"
  mkdir -p "$corpus" "$findings"
  limit=(-max_total_time="$amount"); [ "$mode" = runs ] && limit=(-runs="$amount")
  log="$BUILD_DIR/fuzz-$name.log"
  start=$(date +%s.%N)
  stamp="$BUILD_DIR/.fuzz-start-$name"; touch "$stamp"
  set +e
  "$BUILD_DIR/tests/fuzz/$t" "${limit[@]}" -max_len="${MAX_LEN:-4096}" -timeout="${FUZZ_TIMEOUT:-60}" -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$findings/" ${FUZZ_FLAGS:-} "$corpus" "tests/fuzz/corpus/$name" \
    >"$log" 2>&1
  rc=$?
  set -e
  secs=$(echo "$(date +%s.%N) - $start" | bc)
  execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -1)
  rate=$(sed -n 's/^stat::average_exec_per_sec: *//p' "$log" | tail -1)
  # New crash/leak/timeout/oom inputs of this run (slow-unit-* files are only reports).
  n_find=$(find "$findings" -type f -newer "$stamp" \( -name 'crash-*' -o -name 'leak-*' -o -name 'timeout-*' \
           -o -name 'oom-*' \) | wc -l)
  [ "$rc" -ne 0 ] && [ "$n_find" -eq 0 ] && n_find="rc=$rc"
  printf '%-24s %12s %10s %9s %.0f\n' "$t" "${execs:-?}" "${rate:-?}" "$n_find" "$secs"
  if [ "$rc" -ne 0 ] || [ "$n_find" != 0 ]; then
    status=1
    grep -E "ERROR|FUZZ_CHECK|runtime error|SUMMARY" "$log" | head -5 | sed 's/^/    /'
    echo "    log: $log; findings: $findings/"
  fi
done
exit $status
