#!/usr/bin/env bash
# The session's GPU work in one call of under 10 minutes, most important first, each step cut to the
# time left before a deadline (BUDGET seconds after the start, default 585). STEPS picks them
# (default "bench tests sanitize kernels"):
#   bench     hiraishin bench of every order (ORDERS), widths 1..16, prefill 512, the draft (under DRAFT_ORDERS
#             if set, else ORDERS; BENCH_ARGS: more arguments, e.g. --draft-ahead), exact
#             speculation (the issue figures), then the price-of-exactness table made from that JSON; up to
#             BENCH_TIMEOUT s (default 420: on a fresh H100 every order's kernels compile first, and 245-250 s
#             cut it twice in session 30; with them compiled it took 45-200 s);
#   tests     the GPU tests of TESTS (default all of tests/), up to TEST_TIMEOUT s (default 170; interrupted
#             there, so the counts and JUnit file still come; pytest-xdist's -n TEST_WORKERS, default 4, where the
#             device has xdist: every GPU test took ~4 min on the H200 in session 22, more than 7 on the H100 in 25);
#   sanitize  compute-sanitizer racecheck, initcheck and memcheck (SANITIZERS) over whole passes
#             (bench/sanitize_engine.py), each up to SANITIZE_TIMEOUT s (default 100; racecheck needed
#             more than 70 s for two of its three orders: give it ~200 with the other steps off; SANITIZE_ORDERS:
#             the orders' bench names, default variant invariant fixed_split subblock);
#   host      bench/host_overhead.py on both shapes: a decode step as a loop makes it against
#             back-to-back replays of its graph (what the host adds per step);
#   sweep     bench/sweep_mmvq.py over the launch variants of 2-4 columns (rows per CUDA block, unroll;
#             SWEEP_MULTI): the verify pass of k+1 ~ 3 tokens in plain steps is what sets the exact
#             speculative ratio (session 4: 1.34 of 2.0 plain steps per cycle under BATCH_INVARIANT);
#   ablate    bench/ablate_pass.py on both shapes: a one-token pass with each kind of small launch left
#             out of its graph (what fusing it away could save at most);
#   ablatew   bench/replay_widths.py --ablate on the 8B: the same variants as ablate at ABLATE_WIDTHS (default
#             1,3) under ABLATE_ORDER (default subblock): where a verify pass's time goes (ABLATE_MATVECS=1:
#             each kind of sub-block mat-vec left out instead, --ablate-matvecs);
#   tune      bench/tune_mmq.py (the sub-block MMA launch at verify widths: warps, register caps, activation
#             prefetch, at 9..16 columns also columns per CUDA block; TUNE_ONLY: shapes whose label holds it)
#             once per width set of TUNE_SETS (default "2,4"; e.g. "2,4 9,16": each sweep starts from the
#             table the one before wrote), then the SUBBLOCK passes of widths AB_WIDTHS replayed without and
#             with the last mmq-tuning.json (HIRAISHIN_MMQ_TUNING): digests and times;
#   matvec    bench/bench_mmq.py --all-orders: the sub-block launches of every Qwen3-8B shape beside
#             BATCH_VARIANT's one-column mat-vec, and every order's mat-vec at widths 1..16, isolated
#             (bench_mmq.json; the bench step's price-of-exactness table reads it when this step ran first);
#   ab        bench/replay_widths.py under each value of an environment variable (AB_VAR, AB_VALUES, AB_ORDERS;
#             default HIRAISHIN_PREFETCH_AHEAD 0 1, invariant; widths AB_WIDTHS, default 1,3): replay times and logits digests of
#             a change that must keep every bit (bench/ab_table.py FOLDER: its rows for a results README);
#   abtree    bench/replay_widths.py from an older tree (AB_TREE, a folder holding its hiraishin/ and bench/, e.g.
#             unpacked from a carried `git archive`) and from this one, AB_ROUNDS times in turn (default 2), under
#             AB_ORDERS at AB_WIDTHS (after AB_CONTEXT prompt tokens if set): replay times and logits digests
#             of a change with no switch of its own;
#   chain     bench/chain_steps.py on both shapes under CHAIN_ORDERS (default fixed_split,invariant): device time
#             per pass of a chain of one-token passes against back-to-back replays; from AB_TREE's tree as
#             well when it is set (the same script run over the old package), CHAIN_ROUNDS times in turn;
#             CHAIN_ARGS: more of its arguments (e.g. "--steps 24 --graph-passes 2,4,8": the chain from graphs of
#             N passes as well, what capturing several passes to a graph would save);
#   abmany    the ab step once per entry of AB_SETS ("VAR=v1,v2 ..."; default the four launch-removing switches
#             HIRAISHIN_SWIGLU_EPILOGUE, HIRAISHIN_ATTN_ROPE, HIRAISHIN_EMBED_NORM, HIRAISHIN_HEAD_ARGMAX, each 0,1),
#             AB_PER s a value;
#   overlap   bench/overlap_passes.py: the 8B's verify graph (OVERLAP_WIDTHS, default 3) and 1-2 of the 0.6B's
#             one-token graphs one after the other and side by side on two streams (OVERLAP_ORDERS): how much
#             of the draft a loop that drafts during the verify could hide;
#   pdl       the ab step for HIRAISHIN_PDL_TRIGGER=after_wait and =early (PDL_ORDERS, default invariant,subblock);
#   draft     bench/replay_widths.py on the 0.6B draft under DRAFT_AB_ORDERS (default invariant,nwarps1,nwarps2;
#             widths 1 and 2, the draft's passes): which order drafts fastest (only speed counts there);
#   norm      bench/sweep_norm.py: the fused norm kernels in blocks of other sizes than their tree, and the norm
#             inside the mat-vecs (NORM_VARIANTS; NORM_ARGS: more arguments, e.g. "--orders variant --widths 1"),
#             replay times of both shapes and logits digests (no bit may change);
#   stalls    bench/ncu_stalls.sh over STALL_PROFILES (e.g. "qwen3-8b subblock 16 hx_mmq"), NCU_EXTRA sections
#             beside its own: what bounds a launch (memory latency, a pipe, issue) at a width;
#   inline    bench/proto_inline_norm.py: chains of the library's norm launch + mat-vec, of the mat-vec alone, and of
#             a prototype mat-vec that quantizes its own activations with the norm's scale after (a draft-only
#             order's candidate; bench/NOTES_speculation.md, session 25): whether it costs less than the launch;
#   kernels   per-kernel times under Nsight Compute (bench/kernel_times.sh), if time is left.
# A call that measures a switch and then benchmarks whichever setting won runs this script twice, the
# second time under `export VAR=$(python3 bench/pick_ab.py $OUT VAR BASE CANDIDATE)` (faster by a set margin
# with every logits digest equal, else BASE).
# Usage on the device (repo root): HIRAISHIN_COMMIT=<commit> [STEPS=tests] bash bench/final_session.sh
# It ends by packing CuPy's kernel cache into $OUT/cupy-cache.tgz.part-* (PACK_CUPY_CACHE=0: not); copy
# those into .cache/ here and carry ".cache" next call, and the kernels compiled here are not compiled again.
# Everything lands in $OUT (session.log with it). Stock llama.cpp beside us is bench/llama_cpp_session.sh,
# a call of its own (its speculative example, with the renamed --spec-draft-n-max, is still to be run).
set -uo pipefail
T0=$(date +%s)
BUDGET=${BUDGET:-585}
left() { echo $(( BUDGET - ($(date +%s) - T0) )); }
cap() { local t=$(( $(left) - ${2:-0} )); echo $(( t < $1 ? t : $1 )); }  # seconds for a step: at most $1, $2 kept back
STEPS=" ${STEPS:-bench tests sanitize kernels} "
want() { [[ $STEPS == *" $1 "* ]]; }
source bench/device_env.sh
for shape in qwen3-8b qwen3-0.6b; do
    [ -f /tmp/$shape.gguf ] || python3 -m hiraishin synth --shape $shape -o /tmp/$shape.gguf --quiet
done

if want matvec; then
    echo "== isolated mat-vec launches ($(left) s left)"
    timeout $(cap 240) python3 bench/bench_mmq.py --out "$OUT" --all-orders 2>&1 | grep -v "^  sweep" | tail -n 100
fi

if want bench; then
    echo "== hiraishin bench ($(left) s left)"
    timeout $(cap ${BENCH_TIMEOUT:-420}) python3 -m hiraishin bench /tmp/qwen3-8b.gguf --draft /tmp/qwen3-0.6b.gguf \
        --device cuda --orders ${ORDERS:-variant,invariant,fixed_split,subblock,invariant16} --widths 1-16 --prefill 512 \
        --tokens ${TOKENS:-64} --repetitions ${REPS:-3} ${DRAFT_ORDERS:+--draft-orders $DRAFT_ORDERS} ${BENCH_ARGS:-} --quiet \
        --json "$OUT/hiraishin-bench.json" 2>&1 | tail -n 60
    echo "bench exit ${PIPESTATUS[0]}"
    MATVEC=newest  # the latest committed bench_mmq.json (this card's first), unless the matvec step ran
    [ -f "$OUT/bench_mmq.json" ] && MATVEC="$OUT/bench_mmq.json"
    python3 bench/price_of_exactness.py "$OUT/hiraishin-bench.json" --matvec "$MATVEC" --out "$OUT" 2>&1 | tail -n 5
fi

if want host; then
    echo "== host overhead ($(left) s left)"
    timeout $(cap 120) python3 bench/host_overhead.py /tmp/qwen3-0.6b.gguf /tmp/qwen3-8b.gguf \
        --json "$OUT/host-overhead.json" ${HOST_ARGS:-} 2>&1 | tail -n ${HOST_TAIL:-4}
fi

if want ablate; then
    echo "== ablation of small launches ($(left) s left)"
    timeout $(cap 200) python3 bench/ablate_pass.py /tmp/qwen3-0.6b.gguf /tmp/qwen3-8b.gguf \
        --order ${ABLATE_ORDER:-invariant} --json "$OUT/ablate-pass.json" 2>&1 | tail -n 20
fi

if want ablatew; then
    echo "== ablation of small launches at widths ${ABLATE_WIDTHS:-1,3} ($(left) s left)"
    timeout $(cap 200) python3 bench/replay_widths.py /tmp/qwen3-8b.gguf --ablate$([ "${ABLATE_MATVECS:-0}" = 1 ] && echo -matvecs) \
        --orders ${ABLATE_ORDER:-subblock} \
        --widths ${ABLATE_WIDTHS:-1,3} --json "$OUT/ablate-widths.json" 2>&1 | tail -n 24
fi

# Replays and logits digests under each value of one environment variable (a change that must keep
# every bit): ab_replays VAR "VALUES" ORDERS SECONDS_PER_VALUE
# a value as part of a file name that comes back from the device ("/" and ":" are not kept there)
safe_name() { local s=${1//\//_}; echo "${s//:/-}"; }

ab_replays() {
    local var=$1 values=$2 orders=$3 per=$4 v
    for v in $values; do
        echo "== replays under $var=$v ($(left) s left)"
        env "$var=$v" timeout $(cap $per) python3 bench/replay_widths.py /tmp/qwen3-0.6b.gguf \
            /tmp/qwen3-8b.gguf --orders $orders --widths ${AB_WIDTHS:-1,3} --json "$OUT/replay-$var-$(safe_name "$v").json" 2>&1 | tail -n 12
    done
    python3 - "$OUT" "$var" $values <<'PY'
import json, sys
out, var, values = sys.argv[1], sys.argv[2], sys.argv[3:]
runs = [json.load(open(f"{out}/replay-{var}-{v.replace('/', '_').replace(':', '-')}.json"))["rows"] for v in values]
for rows in zip(*runs):
    same = "same bits" if len({r["logits_sha256"] for r in rows}) == 1 else "BITS DIFFER"
    times = " -> ".join(f"{r['replay_ms']:.3f}" for r in rows)
    print(f"{rows[0]['model']} {rows[0]['order']} width {rows[0]['width']}: {times} ms ({var} {' '.join(values)}; {same})")
PY
}

if want overlap; then
    echo "== a draft pass beside the verify pass ($(left) s left)"
    timeout $(cap 150) python3 bench/overlap_passes.py /tmp/qwen3-8b.gguf /tmp/qwen3-0.6b.gguf \
        --orders ${OVERLAP_ORDERS:-subblock,invariant} --widths ${OVERLAP_WIDTHS:-3} --draft-passes 1,2 \
        --json "$OUT/overlap-passes.json" 2>&1 | tail -n 12
fi

if want draft; then
    echo "== draft orders ($(left) s left)"
    timeout $(cap 90) python3 bench/replay_widths.py /tmp/qwen3-0.6b.gguf --orders ${DRAFT_AB_ORDERS:-invariant,nwarps1,nwarps2} \
        --widths 1,2 --json "$OUT/replay-draft-orders.json" 2>&1 | tail -n 12
fi

if want abtree; then
    [ -d "${AB_TREE:-}/hiraishin" ] || { echo "abtree: AB_TREE=${AB_TREE:-} holds no hiraishin/"; exit 2; }
    # AB_CONTEXT: the old tree may predate --context; this tree's script runs over its package instead
    [ -n "${AB_CONTEXT:-}" ] && cp bench/replay_widths.py "$AB_TREE/bench/replay_widths.py"
    for r in $(seq 1 ${AB_ROUNDS:-2}); do
        for v in old new; do
            dir=$PWD; [ $v = old ] && dir=$(cd "$AB_TREE" && pwd)
            echo "== replays, $v tree, round $r ($(left) s left)"
            (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout $(cap 100) python3 bench/replay_widths.py \
                ${AB_CONTEXT:+--context $AB_CONTEXT} ${AB_MODELS:-/tmp/qwen3-0.6b.gguf /tmp/qwen3-8b.gguf} --orders ${AB_ORDERS:-subblock} \
                --widths ${AB_WIDTHS:-1,3} --json "$OUT/replay-tree-$v-$r.json" 2>&1 | tail -n 14)
        done
    done
    python3 - "$OUT" ${AB_ROUNDS:-2} <<'PY'
import json, sys
out, rounds = sys.argv[1], int(sys.argv[2])
runs = {v: [json.load(open(f"{out}/replay-tree-{v}-{r}.json"))["rows"] for r in range(1, rounds + 1)] for v in ("old", "new")}
for i, row in enumerate(runs["old"][0]):
    old = [rs[i]["replay_ms"] for rs in runs["old"]]
    new = [rs[i]["replay_ms"] for rs in runs["new"]]
    digests = {rs[i]["logits_sha256"] for v in runs for rs in runs[v]}
    finite = all(rs[i].get("logits_finite", True) for v in runs for rs in runs[v])
    bits = ("same bits" if len(digests) == 1 else "BITS DIFFER") + ("" if finite else ", NON-FINITE LOGITS")
    print(f"{row['model']} {row['order']} width {row['width']}: old {' '.join(f'{t:.3f}' for t in old)} -> new "
          f"{' '.join(f'{t:.3f}' for t in new)} ms ({bits})")
PY
fi

if want chain; then
    trees="new"; [ -d "${AB_TREE:-}/hiraishin" ] && trees="old new"
    [ -d "${AB_TREE:-}/hiraishin" ] && cp bench/chain_steps.py "$AB_TREE/bench/chain_steps.py"
    for r in $(seq 1 ${CHAIN_ROUNDS:-2}); do
        for v in $trees; do
            dir=$PWD; [ $v = old ] && dir=$(cd "$AB_TREE" && pwd)
            echo "== chains, $v tree, round $r ($(left) s left)"
            (cd "$dir" && PYTHONPATH=/tmp/site:$dir timeout $(cap 90) python3 bench/chain_steps.py \
                /tmp/qwen3-0.6b.gguf /tmp/qwen3-8b.gguf --orders ${CHAIN_ORDERS:-fixed_split,invariant} \
                ${CHAIN_ARGS:-} --json "$OUT/chain-$v-$r.json" 2>&1 | tail -n 24)
        done
    done
fi

want pdl && ab_replays HIRAISHIN_PDL_TRIGGER "after_wait early" "${PDL_ORDERS:-invariant,subblock}" 170
want ab && ab_replays "${AB_VAR:-HIRAISHIN_PREFETCH_AHEAD}" "${AB_VALUES:-0 1}" "${AB_ORDERS:-invariant}" 120
# several switches in one call: AB_SETS="VAR=v1,v2 VAR2=v1,v2 ...", each an ab step of its own (AB_ORDERS, AB_WIDTHS)
if want abmany; then
    for set in ${AB_SETS:-HIRAISHIN_SWIGLU_EPILOGUE=0,1 HIRAISHIN_ATTN_ROPE=0,1 HIRAISHIN_EMBED_NORM=0,1 HIRAISHIN_HEAD_ARGMAX=0,1}; do
        values=${set#*=}
        ab_replays "${set%%=*}" "${values//,/ }" "${AB_ORDERS:-invariant}" ${AB_PER:-80}
    done
fi

if want tune; then
    prev=""
    for ws in ${TUNE_SETS:-2,4}; do
        echo "== sub-block MMA launch sweep at widths $ws ($(left) s left)"
        d="$OUT/tune-${ws//,/-}"  # (no comma in a name that comes back from the device)
        HIRAISHIN_MMQ_TUNING=$prev timeout $(cap ${TUNE_TIMEOUT:-200}) python3 bench/tune_mmq.py --out "$d" \
            --widths $ws ${TUNE_ONLY:+--only "$TUNE_ONLY"} 2>&1 | grep -v "^  " | tail -n 30
        [ -f "$d/mmq-tuning.json" ] && prev="$d/mmq-tuning.json"
    done
    [ -n "$prev" ] && cp "$prev" "$OUT/mmq-tuning.json"
    for v in library tuned; do
        echo "== SUBBLOCK replays, $v launches ($(left) s left)"
        f=""; [ $v = tuned ] && f="$OUT/mmq-tuning.json"
        HIRAISHIN_MMQ_TUNING=$f timeout $(cap 100) python3 bench/replay_widths.py /tmp/qwen3-0.6b.gguf /tmp/qwen3-8b.gguf \
            --orders subblock --widths ${AB_WIDTHS:-1,2,3,4,5} --json "$OUT/replay-tuning-$v.json" 2>&1 | tail -n 12
    done
    python3 - "$OUT" <<'PY'
import json, sys
runs = [json.load(open(f"{sys.argv[1]}/replay-tuning-{v}.json"))["rows"] for v in ("library", "tuned")]
for a, b in zip(*runs):
    same = "same bits" if a["logits_sha256"] == b["logits_sha256"] else "BITS DIFFER"
    print(f"{a['model']} {a['order']} width {a['width']}: {a['replay_ms']:.3f} -> {b['replay_ms']:.3f} ms (library -> tuned; {same})")
PY
fi

if want norm; then
    echo "== norm launch geometry ($(left) s left)"
    timeout $(cap 240) python3 bench/sweep_norm.py /tmp/qwen3-0.6b.gguf /tmp/qwen3-8b.gguf \
        ${NORM_VARIANTS:+--variants $NORM_VARIANTS} $NORM_ARGS --json "$OUT/sweep-norm.json" 2>&1 | tail -n 70
    echo "sweep_norm exit ${PIPESTATUS[0]}"
fi

if want sweep; then
    echo "== mat-vec sweep, 2-4 columns ($(left) s left)"
    timeout $(cap 200) python3 bench/sweep_mmvq.py --out "$OUT" --one-col 2:4 \
        --multi ${SWEEP_MULTI:-2:2:2:2,2:2:1:1,2:2:1:2,3:3:2:2,3:3:1:1,3:3:1:2,3:3:4:1,4:4:2:2,4:4:1:1,4:4:1:2} 2>&1 | tail -n 60
fi

if want inline; then
    echo "== inline-quantizing mat-vec prototype ($(left) s left)"
    timeout $(cap 150) python3 bench/proto_inline_norm.py --json "$OUT/proto-inline-norm.json" 2>&1 | tail -n 8
fi

if want stalls; then
    echo "== ncu stalls ($(left) s left)"
    NCU_TIMEOUT=${NCU_TIMEOUT:-90} bash bench/ncu_stalls.sh 2>&1 | grep -v "^== device" | tail -n ${STALL_TAIL:-150}
fi

if want tests; then
    echo "== GPU tests ($(left) s left)"
    XDIST=$(python3 -c "import xdist" 2>/dev/null && echo "-n ${TEST_WORKERS:-4}")
    # SIGINT at the limit: pytest stops as on Ctrl-C and still prints its counts and writes the JUnit file
    # (session 25's whole suite, killed at 420 s, left only its progress dots)
    timeout -s INT -k 30 $(cap ${TEST_TIMEOUT:-170} 40) python3 -m pytest -q -m gpu -p no:cacheprovider --durations=15 $XDIST \
        --junitxml="$OUT/gpu-tests.xml" ${TESTS:-tests} 2>&1 | tail -n 40
fi

for tool in ${SANITIZERS:-racecheck initcheck memcheck}; do
    want sanitize || break
    t=$(cap ${SANITIZE_TIMEOUT:-100} 20)
    (( t < 20 )) && { echo "== compute-sanitizer --tool $tool: no time left"; continue; }
    echo "== compute-sanitizer --tool $tool (up to $t s)"
    timeout $t compute-sanitizer --tool $tool --error-exitcode 3 python3 bench/sanitize_engine.py ${SANITIZE_ORDERS:-} \
        > "$OUT/sanitizer-$tool.txt" 2>&1
    echo "exit $?"; tail -n 4 "$OUT/sanitizer-$tool.txt"
done

if want kernels && (( $(left) > 50 )); then
    AHEAD_AB=" " NCU_TIMEOUT=$(( ($(left) - 10) / 2 )) PROFILES=${PROFILES:-"qwen3-0.6b invariant 1;qwen3-8b invariant 1"} \
        bash bench/kernel_times.sh 2>&1 | grep -v "^by kernel and grid" | head -n 50
fi
[ "${PACK_CUPY_CACHE:-1}" = 1 ] && pack_cupy_cache  # for the next call to carry (bench/device_env.sh)
echo "== done after $(( $(date +%s) - T0 )) s"; date -u
