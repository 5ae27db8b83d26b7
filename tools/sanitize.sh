#!/usr/bin/env bash
# Builds the unit tests under AddressSanitizer + UndefinedBehaviorSanitizer (gcc) into build-asan/
# and runs them with ctest (labels starting with "unit"). Any ASan report, leak or UBSan report
# fails the test that triggered it (UBSan is built with -fno-sanitize-recover).
#   tools/sanitize.sh                       the default test binaries below
#   tools/sanitize.sh test_chat test_server only these
# Env: BUILD_DIR (build-asan), JOBS (2), CTEST_JOBS (2).
set -euo pipefail
cd "$(dirname "$0")/.."
BUILD_DIR="${BUILD_DIR:-build-asan}"
# The default: unit-labelled binaries that need no weights, no GPU and no server build (Jinja/chat
# templates, tokenizer, thread pool, dtype), so CI stays within minutes on 2 cores. The server's
# parsers run under ASan+UBSan in the fuzz targets. More: `tools/sanitize.sh test_grammar
# test_server ...` (test_server builds ds_server, ds_model and ds_backend instrumented).
targets=("$@")
[ ${#targets[@]} -eq 0 ] && targets=(test_chat test_tokenizer thread_pool_test dtype_test)
if [ ! -f "$BUILD_DIR/CMakeCache.txt" ]; then
  cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1 -g" -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1 -g" \
    -DDELTASERVE_SANITIZE=address,undefined -DDELTASERVE_CUDA=OFF -DDELTASERVE_BENCH=OFF >/dev/null
fi
cmake --build "$BUILD_DIR" -j "${JOBS:-2}" --target "${targets[@]}"
export ASAN_OPTIONS="${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1}"
export UBSAN_OPTIONS="${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}"
# Tests of binaries not built here show up as *_NOT_BUILT; only the built ones run.
ctest --test-dir "$BUILD_DIR" -L '^(unit|grammar|ops)' -E 'NOT_BUILT' --output-on-failure -j "${CTEST_JOBS:-2}" \
  --timeout 600 2>&1 | tee "$BUILD_DIR/sanitize.log" | grep -vE '^ *[0-9]+/[0-9]+ Test +#[0-9]+: .* Passed' || true
grep -q '100% tests passed' "$BUILD_DIR/sanitize.log"
