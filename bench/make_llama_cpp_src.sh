#!/usr/bin/env bash
# Make .whl/llama.cpp-src.tar.xz (~2.8 MB), the llama.cpp sources bench/llama_cpp_session.sh builds on the
# device (which cannot download): the tree the llama-cpp-python sdist vendors, without what a CUDA sm_90
# build of llama-bench and the speculative examples does not read. Run here, in the repo root.
set -euo pipefail
VERSION=${LLAMA_CPP_PYTHON_VERSION:-0.3.36}
REPO=$PWD
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
python3 -m pip download -q --no-deps --no-binary :all: "llama-cpp-python==$VERSION" -d "$TMP"
tar -xzf "$TMP"/llama_cpp_python-"$VERSION".tar.gz -C "$TMP"
cd "$TMP"/llama_cpp_python-"$VERSION"/vendor/llama.cpp
rm -rf docs models media tests gguf-py conversion scripts benches ci app skills pocs grammars requirements \
    tools/ui tools/server tools/mtmd tools/tts
for d in ggml/src/ggml-*/; do
    case "$d" in ggml/src/ggml-cuda/|ggml/src/ggml-cpu/) ;; *) rm -rf "$d" ;; esac
done
cd ..
mkdir -p "$REPO/.whl"
tar -cJf "$TMP/src.tar.xz" llama.cpp
mv "$TMP/src.tar.xz" "$REPO/.whl/llama.cpp-src.tar.xz"
ls -la "$REPO/.whl/llama.cpp-src.tar.xz"
