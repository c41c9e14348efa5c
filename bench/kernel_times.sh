#!/usr/bin/env bash
# One GPU call: per-kernel times (Nsight Compute) of one eager decode step of the synthetic 0.6B and
# 8B shapes, and a quick `hiraishin bench` with the mat-vec prefetch one wave ahead on and off.
# Usage on the device (repo root): HIRAISHIN_COMMIT=<commit> bash bench/kernel_times.sh
set -uo pipefail
source bench/device_env.sh
for shape in qwen3-8b qwen3-0.6b; do  # (kept from an earlier step of the same call)
    [ -f /tmp/$shape.gguf ] || python3 -m hiraishin synth --shape $shape -o /tmp/$shape.gguf --quiet
done
# PROFILES: "shape order tokens" items separated by ';'
IFS=';' read -r -a specs <<< "${PROFILES:-qwen3-0.6b invariant 1;qwen3-8b invariant 1;qwen3-8b subblock 3}"
for spec in "${specs[@]}"; do
    set -- $spec
    name="$1-$2-$3"
    echo "== ncu $name"
    timeout ${NCU_TIMEOUT:-120} ncu --profile-from-start off --clock-control none --cache-control none \
        --metrics gpu__time_duration.sum --csv --log-file "$OUT/ncu-$name.csv" \
        python3 bench/kernel_times.py /tmp/$1.gguf --order $2 --tokens $3 > "$OUT/ncu-$name.log" 2>&1
    echo "exit $?"
    python3 bench/kernel_times.py --summarize "$OUT/ncu-$name.csv" --json "$OUT/kernel-times-$name.json" | head -n 48
done
for ahead in ${AHEAD_AB:-1 0}; do  # HIRAISHIN_PREFETCH_AHEAD=1 turns the opt-in prefetch on (AHEAD_AB=" ": skip)
    echo "== hiraishin bench, HIRAISHIN_PREFETCH_AHEAD=$ahead"
    HIRAISHIN_PREFETCH_AHEAD=$ahead timeout ${BENCH_TIMEOUT:-120} python3 -m hiraishin bench /tmp/qwen3-8b.gguf \
        --draft /tmp/qwen3-0.6b.gguf --device cuda --orders ${BENCH_ORDERS:-invariant} --widths 1,3 --prefill 16 \
        --tokens 32 --repetitions 3 --quiet --json "$OUT/hiraishin-bench-ahead$ahead.json" 2>&1 | sed -n '/decode ms/,/== plain/p' | head -n 30
done
echo "== done"; date -u
