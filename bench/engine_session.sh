#!/usr/bin/env bash
# One GPU call: carried wheels, the GPU tests, `hiraishin bench` on the synthetic Qwen3-8B shape
# with the 0.6B shape as its draft, the 8,192-token soak, compute-sanitizer over a whole pass.
# Usage on the device (repo root): HIRAISHIN_COMMIT=<commit> bash bench/engine_session.sh
# Env: STEPS ("tests bench soak sanitize" by default), TESTS (pytest paths, default the engine's),
# BENCH_ARGS (extra bench flags), *_TIMEOUT (seconds per step).
set -uo pipefail
source bench/device_env.sh
STEPS=${STEPS:-"tests bench soak sanitize"}
if [[ $STEPS == *tests* ]]; then
    echo "== gpu tests"
    t0=$(date +%s)
    timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -x -m gpu -p no:cacheprovider ${TESTS:-tests/test_engine_gpu.py tests/test_fused_gpu.py} 2>&1 | tail -n 40
    echo "gpu tests took $(( $(date +%s) - t0 )) s"
fi
if [[ $STEPS == *bench* ]]; then
    echo "== synthetic models"
    t0=$(date +%s)
    python3 -m hiraishin synth --shape qwen3-8b -o /tmp/qwen3-8b.gguf --quiet && python3 -m hiraishin synth --shape qwen3-0.6b -o /tmp/qwen3-0.6b.gguf --quiet
    echo "written in $(( $(date +%s) - t0 )) s"
    echo "== hiraishin bench"
    timeout ${BENCH_TIMEOUT:-330} python3 -m hiraishin bench /tmp/qwen3-8b.gguf --draft /tmp/qwen3-0.6b.gguf --device cuda \
        --json "$OUT/hiraishin-bench.json" ${BENCH_ARGS:-}
    echo "bench exit $?"
fi
if [[ $STEPS == *soak* ]]; then
    echo "== soak (8,192 tokens, qwen3-0.6b shape)"
    mkdir -p "$OUT/soak"
    timeout ${SOAK_TIMEOUT:-200} python3 bench/soak_gpu.py --device cuda --out "$OUT/soak" 2>&1 | tail -n 25
    echo "soak exit $?"
fi
if [[ $STEPS == *sanitize* ]] && command -v compute-sanitizer >/dev/null; then
    for tool in ${SANITIZERS:-memcheck racecheck initcheck}; do
        echo "== compute-sanitizer --tool $tool (a whole pass, every order)"
        timeout ${SANITIZE_TIMEOUT:-150} compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize_engine.py \
            > "$OUT/sanitizer-$tool.txt" 2>&1
        echo "exit $?"; tail -n 4 "$OUT/sanitizer-$tool.txt"
    done
fi
echo "== done"; date -u
