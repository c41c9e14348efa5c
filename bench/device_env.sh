# Sourced by the bench/*_session.sh scripts on the device machine (repo root): $OUT, a session log,
# the carried wheels (.whl, see ../.library/device/README.md) on PYTHONPATH, the cache and commit
# variables, and the device line. Usage: source bench/device_env.sh
# A script started by another one that already did this (final_session.sh -> kernel_times.sh) skips it.
#
# CuPy's on-disk cache of compiled kernels (NVRTC cubins keyed by source, options and compiler version)
# travels between calls: a fresh machine compiles every kernel again, ~4 minutes of a bench of four orders
# (session 19). A call that ends with pack_cupy_cache leaves $OUT/cupy-cache.tgz.part-aa (-ab, ...: files
# back are at most 16 MiB each); copied here into .cache/ (git-ignored) and carried (carry ".cache"), the
# next call starts from them.
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
    export CUPY_CACHE_DIR=${CUPY_CACHE_DIR:-/tmp/cupy-kernel-cache}
    mkdir -p "$CUPY_CACHE_DIR"
    if ls .cache/cupy-cache.tgz.part-* >/dev/null 2>&1; then
        cat .cache/cupy-cache.tgz.part-* | tar -xz -C "$CUPY_CACHE_DIR" \
            && echo "cupy kernel cache: $(ls "$CUPY_CACHE_DIR" | wc -l) files from .cache/cupy-cache.tgz.part-*"
    fi
    echo "== device"; date -u
    nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
fi

# The kernel cache into $OUT for the next call to carry, in parts of at most CUPY_PART_MIB MiB (default 15),
# none kept when it needs more than CUPY_MAX_PARTS parts (default 3: the carried tree is at most 64 MiB).
pack_cupy_cache() {
    local part=$(( ${CUPY_PART_MIB:-15} * 1024 * 1024 )) parts
    rm -f "$OUT"/cupy-cache.tgz.part-*
    tar -cz -C "$CUPY_CACHE_DIR" . | split -b "$part" - "$OUT/cupy-cache.tgz.part-" || return 0
    parts=$(ls "$OUT"/cupy-cache.tgz.part-* | wc -l)
    if (( parts > ${CUPY_MAX_PARTS:-3} )); then
        echo "cupy kernel cache: $parts parts of ${CUPY_PART_MIB:-15} MiB, more than ${CUPY_MAX_PARTS:-3}: not kept"
        rm -f "$OUT"/cupy-cache.tgz.part-*
    else
        echo "cupy kernel cache: $(ls "$CUPY_CACHE_DIR" | wc -l) files in $parts part(s): $OUT/cupy-cache.tgz.part-*"
    fi
}
