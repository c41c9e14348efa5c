#!/usr/bin/env bash
# One GPU session: install carried wheels, run the GPU tests, the benchmarks and the
# sanitizer checks, and leave everything under $OUT (results.tar.gz + session.log).
# Usage on the device machine (repo root):  bash bench/gpu_session.sh [pytest -k expr]
# Pass HIRAISHIN_COMMIT=<commit> for the benchmark records: the device's copy of the tree may
# carry no .git, or a stale one.
set -uo pipefail
source bench/device_env.sh
RES="$OUT/results"
mkdir -p "$RES"
export HIRAISHIN_RESULTS_DIR="$RES"
python3 -c "import cupy, numba, numpy; print('cupy', cupy.__version__, 'numba', numba.__version__, 'numpy', numpy.__version__)"

STEPS=${STEPS:-"tests bench sanitize"}
KEXPR=${1:-}

if [[ $STEPS == *tests* ]]; then
    echo "== gpu tests"
    t0=$(date +%s)
    timeout ${TEST_TIMEOUT:-330} python3 -m pytest -q --timeout=240 -m gpu ${KEXPR:+-k "$KEXPR"} --junitxml="$RES/gpu-tests.xml" -p no:cacheprovider tests 2>&1 | tail -n 60
    echo "gpu tests took $(( $(date +%s) - t0 )) s"
fi
if [[ $STEPS == *notebooks* ]] && ls .nbpy/*.py >/dev/null 2>&1; then
    # the notebooks' code cells as scripts (the device has no Jupyter), device="auto" -> CUDA
    for nb in .nbpy/*.py; do
        echo "== notebook $nb"
        t0=$(date +%s)
        (cd /tmp && MPLBACKEND=Agg timeout 200 python3 "$OLDPWD/$nb" > "$RES/$(basename "$nb" .py).out" 2>&1)
        echo "exit $? in $(( $(date +%s) - t0 )) s"; tail -n 3 "$RES/$(basename "$nb" .py).out"
    done
fi
if [[ $STEPS == *demo* ]]; then
    echo "== hiraishin demo (GPU)"
    mkdir -p "$RES/demo"
    timeout 200 python3 -m hiraishin demo --device cuda --json-dir "$RES/demo" 2>&1 | grep -v "it/s\|step/s" | tail -n 30
fi
if [[ $STEPS == *bench* ]]; then
    for b in ${BENCHES:-bench/bench_mmvq.py bench/bench_fattn.py bench/bench_model.py bench/profile_decode.py}; do
        [ -f "$b" ] || continue
        echo "== $b"
        timeout ${BENCH_TIMEOUT:-150} python3 "$b" --out "$RES" 2>&1 | tail -n 80
    done
fi
if [[ $STEPS == *sanitize* ]] && command -v compute-sanitizer >/dev/null; then
    for tool in ${FATTN_SANITIZERS-memcheck racecheck}; do
        echo "== compute-sanitizer --tool $tool (attention)"
        timeout 240 compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize_fattn.py > "$RES/sanitizer-$tool.txt" 2>&1
        echo "exit $?"; tail -n 5 "$RES/sanitizer-$tool.txt"
    done
    echo "== compute-sanitizer --tool memcheck (mat-vec, quantize)"
    timeout 240 compute-sanitizer --tool memcheck --error-exitcode 3 python3 bench/sanitize_mmvq.py > "$RES/sanitizer-memcheck-mmvq.txt" 2>&1
    echo "exit $?"; tail -n 5 "$RES/sanitizer-memcheck-mmvq.txt"
fi
tar -czf "$OUT/results.tar.gz" -C "$OUT" results
echo "== done"; date -u
