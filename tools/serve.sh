#!/usr/bin/env bash
# Set up, build, and start the OpenAI-compatible server on the bundled tiny model (models/tiny-coder).
# Extra arguments go to `deltaserve serve` (e.g. --port 30000).
set -euo pipefail
cd "$(dirname "$0")/.."
bash tools/setup.sh
exec "${BUILD_DIR:-build}/src/app/deltaserve" serve "$@"
