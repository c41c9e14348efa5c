#!/usr/bin/env bash
# Stock llama.cpp beside hiraishin on the same synthetic files and GPU (issue 11): build llama-bench and
# the speculative example from the llama.cpp sources that the llama-cpp-python 0.3.36 sdist vendors,
# trimmed to what a CUDA sm_90 build needs (.whl/llama.cpp-src.tar.xz, made as below), then run them.
#   made here by bench/make_llama_cpp_src.sh: pip download --no-binary :all: llama-cpp-python==0.3.36, take
#               vendor/llama.cpp without docs, models, media, tests, gguf-py, scripts, benches, the UI,
#               server and multimodal tools, and every ggml backend but cpu and cuda; tar -cJf.
#   device:     HIRAISHIN_COMMIT=<commit> bash bench/llama_cpp_session.sh   (carry .whl; ~4.5 min build)
# Writes $OUT/llama-bench-*.json (pp512/tg128 and passes of 1..16 tokens) and the speculative log. The
# synthetic models do not agree like trained ones, so llama.cpp's own speculative acceptance here says
# nothing about the report's profile; its per-pass timings do.
# (2026-12-02: built in 282 s and ran; llama-speculative refused --draft-max, renamed --spec-draft-n-max
# in this llama.cpp (common/arg.cpp), which the line below passes.)
set -uo pipefail
source bench/device_env.sh
SRC=/tmp/llama.cpp
rm -rf "$SRC" && mkdir -p /tmp && tar -xJf .whl/llama.cpp-src.tar.xz -C /tmp || exit 1
# build only what is run: llama-bench (tools) and the speculative examples
cat > "$SRC/tools/CMakeLists.txt" <<'CM'
add_subdirectory(llama-bench)
CM
cat > "$SRC/examples/CMakeLists.txt" <<'CM'
add_subdirectory(speculative)
add_subdirectory(speculative-simple)
CM
mkdir -p "$SRC/pocs" "$SRC/app" && : > "$SRC/pocs/CMakeLists.txt" && : > "$SRC/app/CMakeLists.txt"  # trimmed away
echo "== build"; t0=$(date +%s)
cmake -S "$SRC" -B "$SRC/build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DGGML_NATIVE=OFF \
    > "$OUT/llama-cmake.log" 2>&1 || { tail -n 30 "$OUT/llama-cmake.log"; exit 1; }
timeout ${BUILD_TIMEOUT:-420} ninja -C "$SRC/build" -j "$(nproc)" llama-bench llama-speculative llama-speculative-simple \
    > "$OUT/llama-build.log" 2>&1 || { tail -n 30 "$OUT/llama-build.log"; exit 1; }
echo "built in $(( $(date +%s) - t0 )) s"
BIN="$SRC/build/bin"
for shape in qwen3-8b qwen3-0.6b; do
    [ -f /tmp/$shape.gguf ] || python3 -m hiraishin synth --shape $shape -o /tmp/$shape.gguf --quiet
done
if [[ ${LLAMA_BENCH:-1} == 1 ]]; then  # LLAMA_BENCH=0: the speculative example only (llama-bench ran in session 4)
echo "== llama-bench, 8B: pp512, tg128"
"$BIN/llama-bench" -m /tmp/qwen3-8b.gguf -ngl 99 -fa on -p 512 -n 128 -r 3 -o json > "$OUT/llama-bench-8b.json" 2> "$OUT/llama-bench-8b.err"
echo "exit $?"; python3 -c "import json,sys; [print(r.get('n_prompt'), r.get('n_gen'), round(r.get('avg_ts', 0), 1), 'tok/s') for r in json.load(open(sys.argv[1]))]" "$OUT/llama-bench-8b.json"
echo "== llama-bench, 8B: passes of 1..16 tokens (prompt processing of p tokens = one pass)"
"$BIN/llama-bench" -m /tmp/qwen3-8b.gguf -ngl 99 -fa on -p 1,2,3,4,5,8,9,12,16 -n 0 -r 5 -o json > "$OUT/llama-bench-8b-widths.json" 2> "$OUT/llama-bench-8b-widths.err"
echo "exit $?"; python3 -c "import json,sys; [print(r['n_prompt'], 'tokens:', round(1000 * r['n_prompt'] / r['avg_ts'], 3), 'ms') for r in json.load(open(sys.argv[1]))]" "$OUT/llama-bench-8b-widths.json"
echo "== llama-bench, 0.6B draft: tg128"
"$BIN/llama-bench" -m /tmp/qwen3-0.6b.gguf -ngl 99 -fa on -p 0 -n 128 -r 3 -o json > "$OUT/llama-bench-0.6b.json" 2> "$OUT/llama-bench-0.6b.err"
echo "exit $?"; python3 -c "import json,sys; [print('tg', r['n_gen'], round(1000 / r['avg_ts'], 3), 'ms/token') for r in json.load(open(sys.argv[1]))]" "$OUT/llama-bench-0.6b.json"
fi
# --spec-draft-p-min 0: the draft always drafts (llama.cpp's default 0.75 stops a synthetic draft, whose
# probabilities are flat, before its first guess)
echo "== llama-speculative (greedy), 8B target, 0.6B draft, 64 tokens"
timeout 120 "$BIN/llama-speculative" -m /tmp/qwen3-8b.gguf -md /tmp/qwen3-0.6b.gguf -ngl 99 -ngld 99 -fa on \
    --temp 0 --spec-draft-n-max 4 --spec-draft-p-min 0 -n 64 -p "The history of floating point arithmetic" \
    > "$OUT/llama-speculative.log" 2>&1
echo "exit $?"; grep -E "decoded|accept|draft|target|eval time" "$OUT/llama-speculative.log" | tail -n 20
echo "== done"; date -u
