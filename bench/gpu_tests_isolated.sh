#!/usr/bin/env bash
# The GPU tests one file per process, JOBS at a time (default 4), so that a CUDA error (sticky for the
# process's context) fails only the tests of its own file and the first failing test of a file is the
# one that raised it; CUDA_LAUNCH_BLOCKING=1 (set here unless given) makes an illegal access surface in
# the launch that made it. Prints each file's pytest summary and its first failure.
# Usage on the device (repo root): [FILES="tests/test_a_gpu.py ..."] [PYTEST_ARGS=...] bash bench/gpu_tests_isolated.sh
set -uo pipefail
source bench/device_env.sh
export CUDA_LAUNCH_BLOCKING=${CUDA_LAUNCH_BLOCKING:-1}
FILES=${FILES:-$(ls tests/test_*_gpu.py)}
mkdir -p "$OUT/isolated"
run_one() {
    local f=$1 name
    name=$(basename "$f" .py)
    timeout ${FILE_TIMEOUT:-240} python3 -m pytest -q -m gpu -p no:cacheprovider ${PYTEST_ARGS:-} "$f" \
        > "$OUT/isolated/$name.txt" 2>&1
    { echo "== $name exit $?: $(tail -n 1 "$OUT/isolated/$name.txt")"
      grep -m1 -A30 "^_____" "$OUT/isolated/$name.txt" | grep -E "^(____|>|E |[a-z_/]+\.py:[0-9]+)" | head -n 12
    } > "$OUT/isolated/$name.sum"
}
export -f run_one
export OUT PYTEST_ARGS FILE_TIMEOUT
printf '%s\n' $FILES | xargs -P ${JOBS:-4} -I{} bash -c 'run_one {}'
cat "$OUT"/isolated/*.sum
