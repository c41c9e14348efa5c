#!/usr/bin/env bash
# After session 3 (bench/results/2026-12-01-h200-session3/) the one-call pattern is bench/final_session.sh
# (bench, price table, tests, sanitizers by deadline). Still owed on a GPU: racecheck and initcheck over
# bench/sanitize_engine.py run to the end (racecheck needed over 70 s for two of its three orders: give each
# ~200 s, e.g. SANITIZE_TIMEOUT=200 bash bench/next_session.sh perf with BENCH_TIMEOUT small), and stock
# llama.cpp side by side (bench/llama_cpp_session.sh).
# What the next GPU session owes (see bench/results/README.md), in calls of under 10 minutes:
#   HIRAISHIN_COMMIT=<commit> bash bench/next_session.sh tests   # every GPU test (~6-8 min)
#   HIRAISHIN_COMMIT=<commit> bash bench/next_session.sh perf    # bench, kernel times, sanitizers (~8 min)
# and, if device time is left, stock llama.cpp on the same files (a third call, ~7 min; carry .whl with
# llama.cpp-src.tar.xz from bench/make_llama_cpp_src.sh):  bash bench/llama_cpp_session.sh
# Run that one before "perf" and commit its llama-bench JSON: LLAMA_BENCH_JSON="<paths>" then prints
# llama.cpp's measured figures beside ours (hiraishin bench --llama-bench) instead of the recorded ones.
# "tests": pytest -m gpu over tests/ (no -x: every failure is listed), JUnit XML under $OUT.
# "perf": hiraishin bench over every order and width (with the new fused kernels, PDL and the
# stock MMQ path), the price-of-exactness table from it, per-kernel times under Nsight Compute and
# the opt-in prefetch A/B (bench/kernel_times.sh), compute-sanitizer racecheck and initcheck (and
# memcheck) over whole passes, eager and graph-replayed (bench/sanitize_engine.py).
set -uo pipefail
source bench/device_env.sh
WHAT=${1:-tests}
if [[ $WHAT == tests ]]; then
    echo "== every GPU test"; t0=$(date +%s)
    # PYTEST_ARGS: e.g. "-n 4" (pytest-xdist, carried in .whl): compiles and emulators run side by side
    timeout ${TEST_TIMEOUT:-560} python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 ${PYTEST_ARGS:-} \
        --junitxml="$OUT/gpu-tests.xml" tests 2>&1 | tail -n 80
    echo "gpu tests took $(( $(date +%s) - t0 )) s"
fi
if [[ $WHAT == perf ]]; then
    for shape in qwen3-8b qwen3-0.6b; do
        [ -f /tmp/$shape.gguf ] || python3 -m hiraishin synth --shape $shape -o /tmp/$shape.gguf --quiet
    done
    echo "== hiraishin bench"; t0=$(date +%s)
    timeout ${BENCH_TIMEOUT:-240} python3 -m hiraishin bench /tmp/qwen3-8b.gguf --draft /tmp/qwen3-0.6b.gguf \
        --device cuda --orders variant,invariant,subblock,invariant16 --widths 1-16 --prefill 512 --tokens 64 \
        --repetitions 3 --quiet --json "$OUT/hiraishin-bench.json" ${LLAMA_BENCH_JSON:+$(printf -- '--llama-bench %s ' $LLAMA_BENCH_JSON)} \
        2>&1 | tail -n 50
    echo "bench exit $?, $(( $(date +%s) - t0 )) s"
    python3 bench/price_of_exactness.py "$OUT/hiraishin-bench.json" \
        --matvec bench/results/2026-12-01-h200-mmq/run1/bench_mmq.json --out "$OUT" 2>&1 | tail -n 5
    PROFILES=${PROFILES:-"qwen3-0.6b invariant 1;qwen3-8b invariant 1"} bash bench/kernel_times.sh 2>&1 | tail -n 60
    for tool in ${SANITIZERS:-racecheck initcheck memcheck}; do
        echo "== compute-sanitizer --tool $tool"; t0=$(date +%s)
        timeout ${SANITIZE_TIMEOUT:-120} compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize_engine.py \
            > "$OUT/sanitizer-$tool.txt" 2>&1
        echo "exit $?, $(( $(date +%s) - t0 )) s"; tail -n 4 "$OUT/sanitizer-$tool.txt"
    done
fi
echo "== done"; date -u
