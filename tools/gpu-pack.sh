#!/usr/bin/env bash
# tools/gpu-pack.sh: build the GPU binaries here (the device image lacks the host build
# dependencies: GTest, nlohmann_json, Boost, SQLite, ...) for sm_90a, strip them and pack them
# into .gpu/bin.tar.xz (ignored by git; small enough to travel with the working tree), for
# tools/gpu-run.sh on the device machine.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
BUILD=${BUILD:-$ROOT/build-gpu}
cd "$ROOT"
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDELTASERVE_CUDA=ON \
  -DCMAKE_CUDA_ARCHITECTURES=90a-real -DDELTASERVE_WERROR=ON >/dev/null
TARGETS=(deltaserve cuda_ops_test cuda_model_test spec_rollback_test overlap_schedule_test step_memory_test bench_cuda_decode bench_cuda_attention bench_cuda_comm
         bench_cuda_matmul)
ninja -C "$BUILD" -j"${JOBS:-2}" "${TARGETS[@]}"
rm -rf .gpu/bin && mkdir -p .gpu/bin
for f in src/app/deltaserve tests/ops/cuda_ops_test tests/model/cuda_model_test tests/engine/spec_rollback_test \
         tests/engine/overlap_schedule_test tests/engine/step_memory_test \
         bench/cuda/bench_cuda_decode bench/cuda/bench_cuda_attention bench/cuda/bench_cuda_comm bench/cuda/bench_cuda_matmul; do
  strip -o ".gpu/bin/$(basename "$f")" "$BUILD/$f"
done
# Debian libraries deltaserve links that the device image lacks (tools/gpu-run.sh puts lib/ first
# on LD_LIBRARY_PATH); the CUDA runtime and libstdc++ are there.
mkdir -p .gpu/bin/lib
for lib in $(ldd "$BUILD/src/app/deltaserve" | awk '/=> \/lib/ {print $3}' | grep -E 'sqlite3|pcre2|utf8proc'); do
  cp -L "$lib" .gpu/bin/lib/
done
XZ_OPT=-9e tar -C .gpu/bin -cJf .gpu/bin.tar.xz .
rm -rf .gpu/bin
git rev-parse --short HEAD >.gpu/commit
git status --short | grep -v '^??' >.gpu/dirty || true
ls -la .gpu
