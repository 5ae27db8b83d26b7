#!/usr/bin/env bash
# tools/gpu-check.sh: the CUDA backend's check on a GPU machine, in one go.
#   1. configure + build (Release, -DDELTASERVE_CUDA=ON, only the CUDA test/bench targets, -j16),
#      or, with PREBUILT=DIR, use cuda_ops_test / cuda_model_test / bench_cuda_decode built
#      elsewhere (the device image may lack the build's host dependencies);
#   2. ctest -L cuda;
#   3. bench_cuda_decode on the 27B shape with dummy weights (BENCH_ARGS adds flags);
#   4. a short table. Logs go to $OUT (default ./gpu-check-out).
set -uo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-check-out}
BUILD=${BUILD:-$ROOT/build-gpu}
PREBUILT=${PREBUILT:-}
BENCH_ARGS=${BENCH_ARGS:-}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total,memory.used,clocks.sm,clocks.mem,driver_version --format=csv | tee "$OUT/nvidia-smi.txt"
command -v nvcc >/dev/null && nvcc --version | tail -1

# The binaries look for models/ and tests/fixtures/ under the source dir they were built from.
if [ -n "$PREBUILT" ] && [ "$ROOT" != /work/main ] && [ ! -e /work/main ]; then
  mkdir -p /work && ln -s "$ROOT" /work/main
fi

if [ -z "$PREBUILT" ]; then
  echo "== build"
  cmake -S "$ROOT" -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDELTASERVE_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a-real >"$OUT/configure.log" 2>&1 || { tail -30 "$OUT/configure.log"; exit 1; }
  ninja -C "$BUILD" -j16 cuda_ops_test cuda_model_test bench_cuda_decode >"$OUT/build.log" 2>&1 ||
    { tail -40 "$OUT/build.log"; exit 1; }
  BIN_OPS=$BUILD/tests/ops/cuda_ops_test
  BIN_MODEL=$BUILD/tests/model/cuda_model_test
  BIN_BENCH=$BUILD/bench/cuda/bench_cuda_decode
  CTEST_DIR=$BUILD
else
  BIN_OPS=$PREBUILT/cuda_ops_test
  BIN_MODEL=$PREBUILT/cuda_model_test
  BIN_BENCH=$PREBUILT/bench_cuda_decode
  # A CTest tree over the prebuilt binaries (same labels as the CMake registration).
  CTEST_DIR=$(mktemp -d)
  cat >"$CTEST_DIR/CTestTestfile.cmake" <<CT
add_test(cuda_ops_test "$BIN_OPS")
set_tests_properties(cuda_ops_test PROPERTIES LABELS "cuda;ops")
add_test(cuda_model_test "$BIN_MODEL")
set_tests_properties(cuda_model_test PROPERTIES LABELS "cuda;model")
CT
fi

echo "== ctest -L cuda"
(cd "$CTEST_DIR" && ctest -L cuda -V --timeout 600) >"$OUT/ctest.log" 2>&1
test_rc=$?
grep -E 'tests passed|tests failed|Passed|Failed|\*\*\*' "$OUT/ctest.log" | grep -v '^[0-9]*: ' | tail -12
# Per-test lines for the table.
sed -E 's/^[0-9]+: //' "$OUT/ctest.log" | grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|^\[ .* \] (prefill|decode)|Failure|Expected|Which is|rel_err|error' \
  >"$OUT/tests.txt" 2>&1 || true

echo "== bench (bf16 GEMM, the default)"
"$BIN_BENCH" $BENCH_ARGS 2>&1 | tee "$OUT/bench.log"
bench_rc=${PIPESTATUS[0]}
echo "== bench (DELTASERVE_CUDA_GEMM=exact)"
DELTASERVE_CUDA_GEMM=exact "$BIN_BENCH" $BENCH_ARGS >"$OUT/bench_exact.log" 2>&1

echo
echo "== summary"
echo "ctest rc=$test_rc  bench rc=$bench_rc"
grep -E '^\[ +(OK|FAILED|SKIPPED) +\]|^\[ .* \] (prefill|decode)' "$OUT/tests.txt" | sort -u | head -40
grep -vE '^\[' "$OUT/tests.txt" | head -30
echo "bench, bf16 GEMM (default):"; sed -n '/^| metric/,$p' "$OUT/bench.log"
echo "bench, exact GEMM:"; sed -n '/^| metric/,$p' "$OUT/bench_exact.log"
exit $(( test_rc != 0 || bench_rc != 0 ))
