#!/usr/bin/env bash
# One GPU call for fattn_vec_shared (bench/results/2026-12-01-h200-verify-attention): the attention
# GPU tests, the verify-attention benchmark, compute-sanitizer memcheck at the kernel's edge shapes.
# Usage on the device (repo root): HIRAISHIN_COMMIT=<commit> bash bench/verify_attention_session.sh
set -uo pipefail
source bench/device_env.sh
echo "== gpu tests"; t0=$(date +%s)
HIRAISHIN_RESULTS_DIR=$OUT timeout ${TEST_TIMEOUT:-120} python3 -m pytest -q -m gpu -p no:cacheprovider \
    --durations=8 tests/test_fattn_gpu.py 2>&1 | tail -n 40
echo "gpu tests took $(( $(date +%s) - t0 )) s"
echo "== bench_verify_attention"; t0=$(date +%s)
timeout ${BENCH_TIMEOUT:-200} python3 bench/bench_verify_attention.py --out "$OUT"
echo "bench exit $? after $(( $(date +%s) - t0 )) s"
echo "== compute-sanitizer memcheck"; t0=$(date +%s)
timeout ${SANITIZE_TIMEOUT:-120} compute-sanitizer --tool memcheck --error-exitcode 3 python3 bench/sanitize_fattn.py \
    > "$OUT/sanitize_fattn.log" 2>&1
echo "memcheck exit $? after $(( $(date +%s) - t0 )) s"; tail -n 25 "$OUT/sanitize_fattn.log"
