# Sourced by the bench/*_session.sh scripts on the device machine (repo root): $OUT, a session log,
# the carried wheels (.whl, see ../.library/device/README.md) on PYTHONPATH, the cache and commit
# variables, and the device line. Usage: source bench/device_env.sh
# A script started by another one that already did this (final_session.sh -> kernel_times.sh) skips it.
OUT=${OUT:-/tmp/hiraishin-out}
mkdir -p "$OUT"
if [[ -z ${HIRAISHIN_DEVICE_ENV:-} ]]; then
    export HIRAISHIN_DEVICE_ENV=1
    exec > >(tee -a "$OUT/session.log") 2>&1
    export PYTHONUNBUFFERED=1 HIRAISHIN_CACHE=${HIRAISHIN_CACHE:-/tmp/hiraishin-cache}
    export HIRAISHIN_COMMIT=${HIRAISHIN_COMMIT:-unknown}  # the device's .git may be missing or stale
    if ls .whl/*.whl >/dev/null 2>&1; then
        python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
        export PYTHONPATH=/tmp/site:$PWD
    else
        export PYTHONPATH=$PWD
    fi
    echo "== device"; date -u
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
fi
