#!/usr/bin/env bash
# One GPU call for the stock MMQ kernel (hiraishin/kernels/mmq_stock): its GPU tests, the
# benchmark (bench/bench_mmq_stock.py, with the launch sweep), then the model's variant GPU tests.
# Env: TEST_TIMEOUT, BENCH_ARGS (default --sweep), BENCH_TIMEOUT, MODEL_K (pytest -k), MODEL_TIMEOUT.
# Usage on the device (repo root): HIRAISHIN_COMMIT=<commit> bash bench/mmq_stock_session.sh
set -uo pipefail
source bench/device_env.sh
t0=$(date +%s)
echo "== tests/test_mmq_stock_gpu.py"
timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_mmq_stock_gpu.py 2>&1 | tail -n 30
echo "took $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
echo "== bench/bench_mmq_stock.py ${BENCH_ARGS:---sweep}"
timeout ${BENCH_TIMEOUT:-170} python3 bench/bench_mmq_stock.py --out "$OUT" ${BENCH_ARGS:---sweep}
echo "bench exit $?, took $(( $(date +%s) - t0 )) s"; t0=$(date +%s)
echo "== tests/test_model_gpu.py -k ${MODEL_K:-batch_variant}"
timeout ${MODEL_TIMEOUT:-120} python3 -m pytest -q -x -m gpu -p no:cacheprovider tests/test_model_gpu.py -k "${MODEL_K:-batch_variant}" 2>&1 | tail -n 30
echo "took $(( $(date +%s) - t0 )) s"
