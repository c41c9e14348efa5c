#!/usr/bin/env bash
# Nsight Compute sections (speed of light, warp stalls, memory, occupancy) of the first mat-vec launches
# of one eager pass: what bounds a kernel, not only how long it takes. Caches are flushed between
# ncu's replays (--cache-control all) so the weights come from DRAM, as in a decode step; clocks are
# left as found. NCU_EXTRA adds options (e.g. "--section ComputeWorkloadAnalysis --section InstructionStats":
# which pipe is busiest, which instructions issue). Usage on the device (repo root):
#   STALL_PROFILES="qwen3-8b subblock 1 hx_mmq;qwen3-8b subblock 3 hx_mmq" bash bench/ncu_stalls.sh
set -uo pipefail
source bench/device_env.sh
IFS=';' read -r -a specs <<< "${STALL_PROFILES:-qwen3-8b subblock 1 hx_mmq;qwen3-8b subblock 3 hx_mmq;qwen3-8b invariant 1 mmvq}"
for spec in "${specs[@]}"; do
    set -- $spec
    [ -f /tmp/$1.gguf ] || python3 -m hiraishin synth --shape $1 -o /tmp/$1.gguf --quiet
    name="$1-$2-$3-$4"
    echo "== ncu sections $name"
    timeout ${NCU_TIMEOUT:-90} ncu --profile-from-start off --clock-control none --cache-control all \
        --kernel-name "regex:$4" --launch-count ${LAUNCHES:-4} --section SpeedOfLight --section WarpStateStats \
        --section MemoryWorkloadAnalysis --section Occupancy --section LaunchStats ${NCU_EXTRA:-} \
        python3 bench/kernel_times.py /tmp/$1.gguf --order $2 --tokens $3 > "$OUT/ncu-stalls-$name.txt" 2>&1
    echo "exit $?"
    grep -E "hx_|mmvq|Duration|Memory Throughput|DRAM Throughput|Compute \(SM\)|Stall|Achieved Occupancy|Registers Per|Pipe|Issue Slots|Issued Ipc|Executed Ipc|Warp Cycles Per Issued|Theoretical Occ|Block Limit" \
        "$OUT/ncu-stalls-$name.txt" | head -n ${STALL_LINES:-80}
done
