python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site:$PWD
mkdir -p $OUT/r
export HIRAISHIN_RESULTS_DIR=$OUT/r
t0=$(date +%s)
timeout 200 python3 -m pytest -q -x -m gpu tests/test_mmvq_gpu.py -p no:cacheprovider > $OUT/r/gpu-tests-mmvq.txt 2>&1
echo "tests rc $? $(( $(date +%s) - t0 )) s"; tail -2 $OUT/r/gpu-tests-mmvq.txt
nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv > $OUT/r/device.txt
timeout 240 python3 bench/bench_mmvq.py --out $OUT/r 2>&1 | grep -v "^ *variant\|^ *invariant16" | tail -60
timeout 120 python3 bench/bench_model.py --out $OUT/r 2>&1 | tail -15
