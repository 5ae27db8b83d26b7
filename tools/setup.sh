#!/usr/bin/env bash
# Installs the build dependencies (Debian/Ubuntu packages), configures and builds into build/.
# Used by tools/serve.sh and tools/test.sh; safe to run again.
set -euo pipefail
cd "$(dirname "$0")/.."

PKGS=(build-essential cmake ninja-build pkg-config nlohmann-json3-dev libpcre2-dev libutf8proc-dev
      libboost-dev libsqlite3-dev libtoml11-dev libgtest-dev libgmock-dev libbenchmark-dev libsystemd-dev curl
      chromium)  # chromium: headless browser for the status page e2e test (tests/e2e, playwright-core)
missing=()
for p in "${PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""; [ "$(id -u)" -ne 0 ] && SUDO="sudo"
  echo "setup: installing ${missing[*]}"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}"
fi

BUILD_DIR="${BUILD_DIR:-build}"
JOBS="${JOBS:-$(nproc)}"
# A BUILD_DIR configured from another checkout (e.g. a fresh clone reusing an existing build) is
# brought up to date as it is; configuring it from here would fail (CMake ties a build folder to
# one source tree).
configured_from=""
if [ -f "$BUILD_DIR/CMakeCache.txt" ]; then
  configured_from="$(sed -n 's/^CMAKE_HOME_DIRECTORY:INTERNAL=//p' "$BUILD_DIR/CMakeCache.txt")"
fi
if [ -n "$configured_from" ] && [ "$(cd "$configured_from" 2>/dev/null && pwd -P)" != "$(pwd -P)" ]; then
  echo "setup: $BUILD_DIR is the build of $configured_from; using it as it is there"
  cmake --build "$BUILD_DIR" -j "$JOBS"
  exit 0
fi
cmake -S . -B "$BUILD_DIR" -G Ninja -DCMAKE_BUILD_TYPE=Release ${CMAKE_ARGS:-}
cmake --build "$BUILD_DIR" -j "$JOBS"
