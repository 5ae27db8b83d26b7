#!/usr/bin/env bash
# Set up, build, and run every test (ctest). GPU tests (label cuda) report as skipped without a GPU.
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
if [ -f tests/e2e/package.json ]; then
  (cd tests/e2e && npm ci --no-audit --no-fund --loglevel=error)
fi
ctest --test-dir "${BUILD_DIR:-build}" --output-on-failure -j "${CTEST_JOBS:-2}" "$@"
