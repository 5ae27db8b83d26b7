#!/usr/bin/env bash
# tools/gpu-llama-pack.sh: everything llama.cpp's side-by-side run needs on the device machine, in
# .gpu/ (ignored by git): the llama.cpp source tarball (.gpu/llama-src.tar.xz, ~8 MB) and the peer
# scripts with the 27B config and chat template (.gpu/llama/), since the device gets only this
# repository's working tree, not ../shared. Then, on the device (run tool, carry
# [".gpu/llama-src.tar.xz", ".gpu/llama"], ~6 minutes the first time: it builds llama.cpp and writes
# the dummy 27B GGUF; later calls on the same warm machine add LLAMA_BIN=/tmp/llama-gpu/build/bin):
#   CONFIG=.gpu/llama/qwen3.6-27b-config.json TEMPLATE=.gpu/llama/qwen3.6-chat_template.jinja \
#     PP=8192 TG=64 NPL=1,16 REPS=1 SKIP_MTP=1 DEADLINE_S=470 OUT=$OUT bash .gpu/llama/run_on_h200.sh
# SHARED (default ../shared) is where the peer scripts live; the source clone comes from its
# peer-llamacpp/setup.sh (/tmp/llama-src).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
SHARED=${SHARED:-$ROOT/../shared}
PEER=$SHARED/peer-llamacpp
cd "$ROOT"
[ -d /tmp/llama-src/.git ] || bash "$PEER/setup.sh"
[ -f .gpu/llama-src.tar.xz ] || bash "$PEER/gpu/make_src_tarball.sh" /tmp/llama-src "$ROOT/.gpu/llama-src.tar.xz"
rm -rf .gpu/llama && mkdir -p .gpu/llama
cp "$PEER"/gpu/run_on_h200.sh "$PEER"/gpu/make_dummy_gguf.py .gpu/llama/
cp "$SHARED"/reference/qwen3.6-27b-config.json "$SHARED"/reference/qwen3.6-chat_template.jinja .gpu/llama/
ls -la .gpu/llama-src.tar.xz .gpu/llama
