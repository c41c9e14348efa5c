# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # 06 · The price of exactness
#
# Speculative decoding pays off because a verify pass of `n` tokens costs little more than a pass of
# one: the weights are read once for all `n` columns. The invariant order changes what a wide pass
# does — every column gets the one-column geometry (4 warps, where llama.cpp would share 2 warps'
# work across 5–8 columns), a batch of 9–16 runs as two launches of at most 8 (the weights are read
# twice), and every query of a verify pass runs the one-query attention kernel. So exactness has a
# price, and it is measured in one currency: **the cost of a verify pass against its width**, for every
# order. Then: what is left of speculative decoding's speed-up once it is exact?
#
# On a GPU this notebook times the passes live. On the CPU the emulator's times say nothing about a
# GPU, so it reads the committed GPU results under `bench/results/` instead and says which file.

# %%
import json
import textwrap
import time

import matplotlib.pyplot as plt
import numpy as np
from nbsupport import (
    RESULTS,
    Stopwatch,
    committed_results,
    device_name,
    load_model,
    model_path,
    show_file,
    warm_up,
)

from hiraishin import ReductionOrder
from hiraishin.backends import get_backend
from hiraishin.decode.plot import plot_verify_cost
from hiraishin.model.synth import SHAPES
from hiraishin.plans import matvec_plan

# the orders whose mat-vec plan depends on the width alone (SUBBLOCK's also needs the row length)
PLAN_ORDERS = (ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT, ReductionOrder.FIXED_SPLIT)
ORDERS = (*PLAN_ORDERS, ReductionOrder.SUBBLOCK)  # every preset, timed live on a GPU
WIDTHS = list(range(1, 17))
# colour and marker per order, the same in every figure (benchmark files name the orders shortly)
STYLES = {"variant": ("tab:red", "o"), "batch_variant": ("tab:red", "o"), "invariant": ("tab:blue", "s"),
          "batch_invariant": ("tab:blue", "s"), "invariant16": ("tab:cyan", "v"),
          "batch_invariant_16": ("tab:cyan", "v"), "fixed_split": ("tab:green", "^"), "subblock": ("tab:purple", "D")}
clock = Stopwatch()
be = get_backend("auto")
LIVE = be.name == "cuda"
print(f"backend {be.name} on {device_name(be)}:",
      "timing live" if LIVE else f"reading committed GPU results from {RESULTS.relative_to(RESULTS.parents[1])}/")

# %% [markdown]
# ## The plans: what a pass of each width launches
#
# The mat-vec launches of a Q4_K weight (Qwen3-8B's `ffn_up`) for widths 1 to 16 under each order, and
# the invariant policy's split of a wide batch into balanced launches of at most 8 columns:

# %%
print(f"{'width':>5}  " + "  ".join(f"{o.name:<28}" for o in PLAN_ORDERS))
for width in WIDTHS:
    cells = []
    for order in PLAN_ORDERS:
        p = matvec_plan(order, width, "Q4_K")
        cells.append("MMQ order (int8 MMA)" if p.kernel == "mmq_stock" else "tiled mat-mat" if p.kernel == "tiled"
                     else f"{p.nwarps} warps × launches {[n for _, n in p.launches()]}")
    print(f"{width:>5}  " + "  ".join(f"{cell:<28}" for cell in cells))
show_file("hiraishin.plans", "matvec.py", "def _balanced", after=4)

# %% [markdown]
# ## Measure: verify cost against width
#
# On a GPU: one forward pass of `w` tokens after 256 cached cells, median of repeats, every order.
# On the CPU, from the committed GPU results (every folder under `bench/results/`, newest first by the
# date each file records): each order's newest `price-of-exactness.json` figures (a run times the orders
# it was asked for, so the orders may come from different runs: each is named); else the whole-decoder
# benchmark `hiraishin-bench.json` (`hiraishin bench`: verify passes of Qwen3-8B at several widths, per
# order); and beside it the mat-vec benchmark `bench_mmvq.json` (Qwen3-8B's five mat-vec shapes, 1–16
# columns) and the attention benchmark `bench_fattn.json`.

# %%
def newest(name):
    """(path, data) of the newest committed result file called ``name``, by the date it records; or (None, None)."""
    found = [(date, str(f), f, data) for date, f, data in committed_results(name)]
    return max(found)[2:] if found else (None, None)


def newest_per_order(name):
    """order -> (date, path, {width: ms}): each order's rows from the newest committed ``name`` holding it."""
    best = {}
    for date, f, data in committed_results(name):
        per = {}
        for row in data.get("rows", []):  # rows of (order, width, ms)
            per.setdefault(row["order"], {})[int(row["width"])] = float(row["ms"])
        for order_name, per_width in per.items():
            if order_name not in best or best[order_name][0] < date:
                best[order_name] = (date, f, per_width)
    return best


def rel(path):
    return str(path.relative_to(RESULTS.parents[1]))


def time_passes(model, order, widths, repeats=5, kv=256):
    """Median milliseconds of one forward pass of ``w`` tokens after ``kv`` cached cells, per width."""
    out = {}
    model.reset()
    model.forward(list(range(kv)), 0, order=ReductionOrder.BATCH_INVARIANT)
    for w in widths:
        times = []
        for _ in range(repeats):
            model.rollback(kv)
            model.backend.synchronize()
            t0 = time.perf_counter()
            model.forward([1] * w, kv, order=order)
            model.backend.synchronize()
            times.append(time.perf_counter() - t0)
        out[w] = 1e3 * float(np.median(times))
    return out


poe = newest_per_order("price-of-exactness.json")
bench_path, bench = newest("hiraishin-bench.json")
mmvq_path, mmvq = newest("bench_mmvq.json")
fattn_path, fattn = newest("bench_fattn.json")
verify = {}  # order -> {width: ms of one verify pass}
if LIVE:
    model = load_model(model_path(), n_ctx=512)
    with clock("JIT compilation (throwaway passes)"):
        warm_up(model, ORDERS, widths=(1, 2, 5, 9, 16))
    with clock("live timing"):
        verify = {o.name: time_passes(model, o, WIDTHS) for o in ORDERS}
    SOURCE = f"live: {model.name} on {device_name(be)}"
elif poe:
    verify = {order_name: per_width for order_name, (_, _, per_width) in poe.items()}
    runs = {}  # file -> the orders read from it
    for order_name, (date, f, _) in poe.items():
        runs.setdefault((date[:10], rel(f)), []).append(order_name)
    SOURCE = "; ".join(f"{', '.join(names)}: {path} ({date})" for (date, path), names in sorted(runs.items()))
elif bench is not None:
    for order_name, o in bench["orders"].items():
        verify[order_name] = {int(w): float(ms) for w, ms in o["verify_ms"].items()}
    SOURCE = (f"{rel(bench_path)}: {bench['model']['name']} on {bench['device']['name']}, "
              f"{bench['date'][:10]}, commit {bench.get('commit', '?')}")
else:
    SOURCE = None
print("verify passes:", SOURCE or "no source (no GPU here and no committed results in this checkout)")


def style(order_name):
    return STYLES.get(order_name, ("tab:purple", "D"))


if verify:
    plot_verify_cost(verify, textwrap.fill(f"a whole verify pass against its width ({SOURCE})", 110), style=style)
    plt.show()
    print(f"{'order':<19}" + "".join(f"{w:>8}" for w in sorted(next(iter(verify.values())))))
    for order_name, per_width in verify.items():
        print(f"{order_name:<19}" + "".join(f"{per_width[w]:>8.2f}" for w in sorted(per_width)))

# %% [markdown]
# Where the price comes from, kernel by kernel: every order's mat-vec of each of Qwen3-8B's five shapes,
# launched as a forward pass launches it, for 1 to 16 columns. Read from the newest committed
# `price-of-exactness.json` that has them (`bench/bench_mmq.py --all-orders`: isolated launches, weights
# rotated through copies larger than L2, in the same GPU call as the whole-pass benchmark above; an open
# marker is a width where a column's bits differ from the same column at width 16), else from the older
# mat-vec benchmark `bench_mmvq.json` (time ÷ one column; `invariant16`: the invariant geometry in one
# launch of up to 16).

# %%
def newest_matvec_orders():
    """(path, data) of the newest committed price-of-exactness.json with per-order mat-vec rows, or (None, None)."""
    found = [(date, str(f), f, data) for date, f, data in committed_results("price-of-exactness.json") if data.get("matvec_orders")]
    return max(found)[2:] if found else (None, None)


def matvec_panels(per_shape, title, ylabel, point):
    """One panel per shape, one line per order: ``per_shape[shape][order][columns]``, drawn by
    ``point(ax, order, {columns: value}, color, marker)``; dotted at the 8-column launch limit."""
    fig, axes = plt.subplots(1, len(per_shape), figsize=(3.3 * len(per_shape), 3.2), squeeze=False,
                             layout="constrained")
    for ax, (shape, per_order) in zip(axes[0], per_shape.items()):
        for order_name, per_w in per_order.items():
            point(ax, order_name, per_w, *style(order_name))
        ax.axvline(8.5, color="k", ls=":", lw=1)
        ax.set_title(shape, fontsize=8)
        ax.set_xlabel("columns")
        ax.set_xticks([1, 4, 8, 12, 16])
    axes[0, 0].set_ylabel(ylabel)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    fig.suptitle(title, fontsize=10)
    plt.show()


def _us_points(ax, order_name, per_w, color, marker):
    """µs against columns; filled where a column's bits are its width-16 bits, open where they differ."""
    ws = sorted(per_w)
    ax.plot(ws, [per_w[w][0] for w in ws], color=color, lw=1, label=order_name)
    for same in (True, False):
        pts = [(w, per_w[w][0]) for w in ws if per_w[w][1] == same]
        if pts:
            ax.plot(*zip(*pts), ls="", marker=marker, ms=4, color=color, markerfacecolor=color if same else "white")


def _ratio_points(ax, order_name, per_w, color, marker):
    """time ÷ time of one column, on a log scale (the old tiled stand-in's jump would flatten the rest)."""
    ws = sorted(per_w)
    ax.plot(ws, [per_w[w] / per_w[1] for w in ws], marker=marker, ms=4, color=color, label=order_name)
    ax.set_yscale("log", base=2)


mv_path, mv = newest_matvec_orders()
MATVEC = {}  # shape -> order -> {columns: (µs, this column's bits equal its bits at width 16)}
if mv is not None:
    for row in mv["matvec_orders"]:
        key = f"{row['shape']} ({row['qtype']})"
        MATVEC.setdefault(key, {}).setdefault(row["order"], {})[row["ncols"]] = (row["us"], row["bits_equal_width16"])
    matvec_panels(MATVEC, f"every order's mat-vec against columns ({rel(mv_path)}, {mv['device']}, commit "
                  f"{mv['commit']})", "µs per mat-vec", _us_points)
    print(f"{'shape':<40} {'order':<16}" + "".join(f"{w:>7}" for w in (1, 3, 8, 9, 16)) + "   (µs)")
    for shape, per_order in MATVEC.items():
        for order_name, per_w in per_order.items():
            print(f"{shape:<40} {order_name:<16}" + "".join(f"{per_w[w][0]:>7.1f}" for w in (1, 3, 8, 9, 16)))
elif mmvq is not None:
    per_shape = {}
    for row in mmvq["results"]:
        key = f"{row['shape']} ({row['qtype']})"
        per_shape.setdefault(key, {}).setdefault(row["order"], {})[row["ncols"]] = row["time_us"]
    matvec_panels(per_shape, f"mat-vec cost against columns ({rel(mmvq_path)}, {mmvq['meta'].get('device', '?')})",
                  "time ÷ time of 1 column", _ratio_points)
else:
    print("No committed mat-vec benchmark (price-of-exactness.json or bench_mmvq.json) in this checkout.")

# %% [markdown]
# How to read them: a flat line is free width, a climbing line is a price per column. The invariant
# order pays a little per column inside a launch (every column keeps its one-column geometry) and jumps
# at 9, where a second launch reads the weights again. The variant order's line climbs as steeply up to
# 8 columns (llama.cpp's mat-vec, whose warps per column shrink as columns are added: open markers, the
# bits move with the width), then drops onto llama.cpp's MMQ order on int8 tensor cores
# (`hiraishin/kernels/mmq_stock`): stock is cheap past 8 tokens because it switches to a faster kernel
# whose sums differ. The sub-block order is nearly flat from 1 to 8 columns and steps at 9, where a CUDA
# block's warps take a second MMA n-tile of 8 columns: exact at every width, from 5 columns on the
# cheapest line on every shape, and 0.8-1.3x the variant's one column at one column (attn_k/attn_v the 1.3x).
# (In runs from session 12 on, Q4_K launches of 6+ columns read the columns-interleaved MMA8 layouts, faster
# in whole passes; the lone 4096-row attn_q/attn_output launch is slower with them, so its small step comes
# at 6.)
#
# ## Why the sub-block line steps at 9
#
# The tensor cores make a second n-tile's MMAs nearly free, yet 9 columns cost 1.15-1.4x 8 columns. Two
# timing-only builds of the sub-block kernel take the second n-tile apart
# (`bench/results/2026-12-04-h200-session17/`, b): one without the second n-tile's activation loads (it reuses
# the first n-tile's registers), one with those loads but without its MMAs and float work. Their outputs are no
# order's; their times say what each half of the step costs.
# %%
diag_path, diag = newest("proto-superblock-diag.json")
if diag is not None:
    US = {(r["shape"], r["variant"], r["width"]): r["us"] for r in diag["rows"]}
    shapes = list(dict.fromkeys(r["shape"] for r in diag["rows"]))
    bars = (("8 columns", "library", 8), ("9 columns", "library", 9),
            ("9, no 2nd n-tile loads", "diag1", 9), ("9, no 2nd n-tile MMA + float work", "diag2", 9))
    fig, axes = plt.subplots(1, len(shapes), figsize=(2.6 * len(shapes), 3.0), squeeze=False, layout="constrained")
    for ax, shape in zip(axes[0], shapes):
        vals = [US[(shape, v, w)] for _, v, w in bars]
        ax.bar(range(len(bars)), vals, color=["tab:gray", "tab:purple", "tab:orange", "tab:olive"])
        ax.set_xticks(range(len(bars)), ["8", "9", "−loads", "−float"], fontsize=8)
        ax.set_title(shape, fontsize=7)
    axes[0, 0].set_ylabel("µs per mat-vec")
    fig.suptitle(textwrap.fill(f"SUBBLOCK's second n-tile taken apart ({rel(diag_path)}, {diag['device']}, commit "
                               f"{diag['commit']}); bars: " + ", ".join(b[0] for b in bars), 110), fontsize=9)
    plt.show()
    print(f"{'shape':<38}{'8 cols':>8}{'9 cols':>8}{'step':>7}{'-loads':>8}{'-float':>8}   (µs)")
    for shape in shapes:
        u8, u9, d1, d2 = (US[(shape, v, w)] for _, v, w in bars)
        print(f"{shape:<38}{u8:>8.1f}{u9:>8.1f}{u9 - u8:>7.1f}{d1:>8.1f}{d2:>8.1f}")
else:
    print("No committed diagnostic of the second n-tile (proto-superblock-diag.json) in this checkout.")

# %% [markdown]
# On the 4096-input Q4_K shapes and the output head the loads are most of the step (on the 12288-input ffn_down,
# the float work weighs as much or more): a super-block's activations go into the registers of every warp of 16
# rows, once per n-tile of 8 columns. The rest is float work the order itself fixes (per row, column and 32
# values: a scale product, a conversion and two fused multiply-adds), which no tensor core takes away. Sharing
# the loads between two 16-row tiles per warp costs the registers that keep the warps resident (slower); a
# warpgroup MMA that reads the activations from shared memory for 64 rows at once (`bench/proto_wgmma.cu`) keeps
# every bit but was 1.3-1.6x slower, and its own step from 8 to 16 columns no smaller: with the loads gone, the
# float work of the extra columns is the step. An order with less float work per value (one scale per 256
# values) would pay with accuracy, and measured inside the same kernel it took at most ~10% off a 9-16-column
# launch.
#
# Attention, from the attention benchmark (Qwen3-8B heads, 32/8), time per launch against the number of
# queries at each KV length:

# %%
if fattn is not None:
    kvs = sorted({r["kv_len"] for r in fattn["rows"]})
    fig, axes = plt.subplots(1, len(kvs), figsize=(3.4 * len(kvs), 3.2), squeeze=False, layout="constrained")
    for ax, kv in zip(axes[0], kvs):
        for order_name in ("batch_variant", "batch_invariant", "fixed_split"):
            pts = sorted((r["n_queries"], r["us"]) for r in fattn["rows"] if r["order"] == order_name and r["kv_len"] == kv)
            color, marker = style(order_name)
            ax.plot(*zip(*pts), marker=marker, ms=3, color=color, label=order_name)
        ax.set_title(f"KV {kv} cells", fontsize=9)
        ax.set_xlabel("queries per launch")
    axes[0, 0].set_ylabel("µs per launch")
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    fig.suptitle(f"attention ({rel(fattn_path)}, {fattn.get('device', '?')})", fontsize=10)
    plt.show()
else:
    print("No committed attention benchmark (bench_fattn.json) in this checkout.")

# %% [markdown]
# At long KV lengths attention's price is plain to see: the invariant order runs every query of a
# verify pass through the one-query kernel, so its time grows with the number of queries, while the
# variant order's tile kernel handles 8 queries for the price of one launch. Fixed-size splits (two
# queries per block) sit in between. At 512 cells every launch costs the same few tens of µs: launch
# overhead, not work.
#
# ## Where a one-token pass's time goes
#
# Width is not all of a pass's cost. `bench/ablate_pass.py` captured a one-token pass's CUDA graph with
# one kind of small launch left out (the outputs are garbage; only the time is read) and timed its
# replays back to back: what a fusion that removes those launches could save at most. The per-launch
# figure divides the saving by the launches removed (`layers` per layer-kind, two for the norms).

# %%
SHAPE_LAYERS = {name + ".gguf": shape.n_layer for name, shape in SHAPES.items()}
LAUNCHES_PER_LAYER = {"no add+norm": 2, "no swiglu": 1, "no qk norm+rope+kv": 1, "no combine": 1,
                      "no attention partials": 1}
ablations = sorted(RESULTS.rglob("ablate-pass.json"))
ABLATION = json.loads(ablations[-1].read_text()) if ablations else None
if ABLATION is None:
    print("No ablate-pass.json is committed under bench/results/ yet.")
else:
    print("read:", rel(ablations[-1]), f"(commit {ABLATION['commit']}, {ABLATION['date']})")
    print(f"{'model':<17} {'left out':<24} {'pass ms':>8} {'saves µs':>9} {'µs a launch':>12}")
    for r in ABLATION["rows"]:
        n = LAUNCHES_PER_LAYER.get(r["variant"], 0) * SHAPE_LAYERS.get(r["model"], 0)
        per = f"{1e3 * r['saved_ms'] / n:12.2f}" if n else f"{'':>12}"
        print(f"{r['model']:<17} {r['variant']:<24} {r['replay_ms']:>8.3f} {1e3 * r['saved_ms']:>9.1f} {per}")

# %% [markdown]
# The two norm launches of a layer cost about two and a half µs each, the attention and its combine one to
# two; SwiGLU
# and the q/k norms cost nothing measurable (under programmatic dependent launch they run while their
# neighbours wait; a negative saving is the spread between runs). With every small launch gone the
# mat-vecs alone still take half the 0.6B's pass: about 2.4 µs per dependent launch whatever it does. So a
# draft model of ~300 launches has a floor of its own, and a speculative decoder gains when the draft
# gets cheaper *relative to* the target, not when both lose the same fixed cost.
#
# Is a norm launch dear because of its reduction (a sum over the whole row before any value can be
# quantized), or because it is a launch? A later ablation *replaced* the norm launches by elementwise
# launches of the same reads and q8_1 writes (SwiGLU's kernel: what a norm whose scale is applied after
# the mat-vec would cost at most), and a micro-benchmark timed one dependent step two ways: as a launch in
# a CUDA graph, and as a grid-wide barrier inside one persistent kernel (`bench/barrier_vs_launch.py`).

# %%
def newest_rows(pattern, want):
    """(path, rows) of the newest committed file matching ``pattern`` whose rows hold every variant/kind in ``want``."""
    found = []
    for f in RESULTS.rglob(pattern):
        data = json.loads(f.read_text())
        if want <= {r.get("variant", r.get("kind")) for r in data.get("rows", [])}:
            found.append((data.get("date", ""), str(f), f, data["rows"]))
    return max(found)[2:] if found else (None, None)


REPLACED = {}  # model -> (µs saved without the norm launches, µs saved with elementwise launches in their place)
for model_file in ("ablate-0.6b.json", "ablate-8b.json"):
    path, rows = newest_rows(model_file, {"whole pass", "no add+norm", "norm as elementwise"})
    if rows:
        by = {r["variant"]: r for r in rows}
        REPLACED[rows[0]["model"]] = (1e3 * by["no add+norm"]["saved_ms"], 1e3 * by["norm as elementwise"]["saved_ms"])
        print("read:", rel(path))
for model, (removed, replaced) in REPLACED.items():
    print(f"{model:<17} norm launches removed: saves {removed:6.1f} µs; replaced by elementwise launches: "
          f"saves {replaced:5.1f} µs ({replaced / removed:.0%} of it)")

STEP_KINDS = ("launch chain", "launch chain, PDL", "persistent, grid barrier")
barrier_path, STEPS = newest_rows("barrier-vs-launch.json", set(STEP_KINDS))
if STEPS:
    print("read:", rel(barrier_path))
    fig, ax = plt.subplots(figsize=(6, 3.2))
    for kind, colour in zip(STEP_KINDS, ("tab:gray", "tab:blue", "tab:red")):
        pts = sorted((r["blocks"], 1e6 * r["seconds_per_step"]) for r in STEPS if r["kind"] == kind)
        ax.plot(*zip(*pts), marker="o", color=colour, label=kind)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("CUDA blocks of 128 threads")
    ax.set_ylabel("µs per dependent step")
    ax.set_ylim(bottom=0)
    ax.legend(fontsize=8)
    ax.set_title("one dependent step: a launch in a graph, or a grid barrier", fontsize=10)
    plt.show()
else:
    print("No barrier-vs-launch.json is committed under bench/results/ yet.")

# %% [markdown]
# An elementwise launch in the norm's place costs nearly all that the norm did: the reduction is not the
# price, the step is. And a step is cheapest as a launch with programmatic dependent launch (under a µs for
# a few hundred CUDA blocks); a grid barrier in a persistent kernel, one counter every block arrives at,
# costs more and grows with the blocks.
#
# Two ways around a launch were timed next. A norm or an attention combine is a *one-block* step after a
# wide one, so the wide kernel's last block to finish could do it: every block writes its value, makes it
# visible (`__threadfence`) and counts itself in with an atomic; the one that arrives last sums what all
# wrote. No block waits for another, so it is not a barrier. And a two-level barrier: blocks arrive in
# groups of 16, the groups' last arrivals at one root counter, a flag every block spins on.

# %%
TAIL_KINDS = ("wide + one-block step, two PDL launches", "wide step, last block does the one-block step")
tail_path, TAIL = newest_rows("barrier-last-block.json", set(TAIL_KINDS))
if TAIL:
    print("read:", rel(tail_path))
    pair = {(r["kind"], r["blocks"]): 1e6 * r["seconds_per_pair"] for r in TAIL if "seconds_per_pair" in r}
    tree = {r["blocks"]: 1e6 * r["seconds_per_step"] for r in TAIL if r["kind"].startswith("persistent, tree")}
    one = {r["blocks"]: 1e6 * r["seconds_per_step"] for r in (STEPS or []) if r["kind"] == "persistent, grid barrier"}
    print(f"{'blocks':>6} {'two PDL launches':>17} {'last block':>11} {'tree barrier':>13} {'one-counter barrier':>20}")
    for b in sorted({b for _, b in pair}):
        near = min(one, key=lambda c: abs(c - b)) if one else None  # the one-counter runs' nearest block count
        other = f"{one[near]:>17.2f} µs" + (f" ({near} blocks)" if near != b else "") if one else ""
        print(f"{b:>6} {pair[TAIL_KINDS[0], b]:>14.2f} µs {pair[TAIL_KINDS[1], b]:>8.2f} µs "
              f"{tree.get(b, float('nan')):>10.2f} µs {other}")
    print("(a pair: the wide step and the one-block step; the barriers: one step)")
else:
    print("No barrier-last-block.json is committed under bench/results/ yet.")

# %% [markdown]
# The last block costs *more* than a second launch: each block's fence and atomic, then one block's
# serial tail, take longer than a PDL launch boundary, whose next kernel is already resident and waiting.
# The tree barrier pays off only against the one-counter barrier at a thousand blocks, and stays above a
# launch. So the way to a cheaper draft is fewer steps per layer (work merged into a neighbour's kernel
# without lengthening its critical path, as the attention kernel now does with the q8_1 quantization of
# its output when it runs as one parallel block), not a persistent kernel or a last-block tail in place
# of the launches.

# %% [markdown]
# ## Work before the wait
#
# A step's place in the chain is not all dead time. Under programmatic dependent launch the next kernel's
# blocks become resident while the previous kernel still runs, and each waits in `griddepcontrol.wait`
# for its results. Whatever a block reads that no kernel of the pass writes can be read *before* that
# wait: the weights. The mat-vecs used to only ask L2 for their rows there; since session 18 a one-column
# mat-vec thread loads its first weight words into registers before the wait (and decodes them after),
# and a norm kernel its norm weights, so after the wait only the previous kernel's output is read. No
# float operation moves, so no bit changes: each A/B below compares the logits digests of whole
# graph-replayed passes, and they are equal.

# %%
def replay_ab(var):
    """(folder, {value: {(model, order, width): row}}) of the newest committed A/B of environment variable
    ``var`` (bench/final_session.sh's ab step writes replay-VAR-VALUE.json)."""
    files = sorted(RESULTS.rglob(f"replay-{var}-*.json"))
    if not files:
        return None, {}
    folder = max({f.parent for f in files})
    runs = {f.name[len(f"replay-{var}-"):-len(".json")]: json.loads(f.read_text())["rows"] for f in files
            if f.parent == folder}
    return folder, {v: {(r["model"], r["order"], r["width"]): r for r in rows} for v, rows in runs.items()}


EARLY_AB = {}  # (what is loaded early, (model, order, width)) -> (ms without, ms with, same logits digest)
for var, label in (("HIRAISHIN_MMVQ_EARLY", "mat-vec weights"), ("HIRAISHIN_NORM_W_EARLY", "norm weights")):
    folder, runs = replay_ab(var)
    if "0" not in runs or "1" not in runs:
        print(f"No A/B of {var} is committed under bench/results/ yet.")
        continue
    print("read:", rel(folder), f"({var} 0 -> 1)")
    for key in sorted(set(runs["0"]) & set(runs["1"])):
        off, on = runs["0"][key], runs["1"][key]
        EARLY_AB[label, key] = (off["replay_ms"], on["replay_ms"], off["logits_sha256"] == on["logits_sha256"])
print(f"{'read early':<16} {'model':<16} {'order':<16} {'tokens':>6} {'after wait':>11} {'before':>9} {'same bits':>9}")
for (label, (model, order_name, width)), (off, on, same) in EARLY_AB.items():
    print(f"{label:<16} {model:<16} {order_name:<16} {width:>6} {off:>9.3f}ms {on:>7.3f}ms {same!s:>9}")

# %%
if EARLY_AB:  # "no bit changes": every pass's logits digest is the same with and without the early loads
    assert all(same for _, _, same in EARLY_AB.values())

# %% [markdown]
# The mat-vecs' early loads take 4-5% off the draft's one-token pass and about 2% off the 8B's, the norm
# weights another 1% of the 8B's. Loading more than the first step, or in the several-column launches of
# a verify pass, held more registers than it saved (`bench/results/2026-12-04-h200-session18/`). It is the
# first change since the launches came down that makes the one-token passes cheaper without removing a
# step: part of each step's cost was the wait itself, and some of it can be spent loading.

# %% [markdown]
# ## What is left of the speed-up
#
# The measured end-to-end speed-up of speculative decoding per order comes from the whole-decoder
# benchmark (`hiraishin-bench.json`), when one is committed:

# %%
MEASURED = {}
if bench is not None and "speculative" in bench:
    print("read:", rel(bench_path), f"({bench['model']['name']}, draft {bench.get('draft', {}).get('name', '?')}, "
          f"{bench['device']['name']})")
    if bench.get("oracle"):
        print("note:", bench["oracle"].get("description", ""))
    print(f"{'order':<19} {'plain ms/token':>14} {'speculative':>12} {'speed-up':>9} {'= plain?':>9} {'acceptance':>11}")
    for order_name, r in bench["speculative"].items():
        MEASURED[order_name] = r
        print(f"{order_name:<19} {r['plain_ms_per_token']:>14.2f} {r['speculative_ms_per_token']:>12.2f} "
              f"{r['speedup']:>8.2f}x {r['matches_plain']!s:>9} {r['acceptance']:>11.1%}")
else:
    print("No hiraishin-bench.json is committed under bench/results/ yet, so there is no measured end-to-end "
          "speed-up to show; the estimate below is all there is.")

# %% [markdown]
# An estimate, from the standard model of greedy speculative decoding: with acceptance rate α per
# guess and `k` guesses per cycle, a cycle emits `(1 − α^(k+1)) / (1 − α)` tokens on average and costs
# `k` draft passes (each `c` times a target token) plus one verify pass of `k + 1` tokens, whose cost is
# what the orders change (the verify costs above, at the widths measured):

# %%
DRAFT_COST = 0.1  # a draft one tenth of the target's cost per token (Qwen3-0.6B drafting for Qwen3-8B)
ALPHAS = (0.6, 0.8, 0.9)


def best_speedup(per_width, alpha):
    """(speed-up over plain decoding, k) for the best number of guesses k among the measured widths."""
    one = per_width[1]
    return max(((1 - alpha ** w) / (1 - alpha) / ((w - 1) * DRAFT_COST + per_width[w] / one), w - 1)
               for w in per_width if w > 1)


speedup = {(o, a): best_speedup(pw, a) for o, pw in verify.items() for a in ALPHAS}
if speedup:
    print(f"estimated speed-up over plain decoding, best k (draft cost {DRAFT_COST} of a target token):")
    print(f"{'order':<19}" + "".join(f"{'α = ' + str(a):>18}" for a in ALPHAS))
    for order_name in verify:
        print(f"{order_name:<19}" + "".join(f"{speedup[order_name, a][0]:>11.2f}x (k={speedup[order_name, a][1]:>2})"
                                            for a in ALPHAS))
    print("(the variant order's figure is not an exact speed-up: its output need not be plain decoding's)")

# %% [markdown]
# **Interpretation.** The variant order's verify pass is not exact (notebooks 03 and 05), so its
# speed-up is not the one speculative decoding promises. `subblock` (the `SUBBLOCK` preset, where the
# results hold it) is an exact order built for the batch rather than borrowed from one token: each
# 32-value sub-block's integer dot product is scaled and accumulated in a fixed order set by the row
# length alone (`hiraishin/plans/subblock.py`), so 1 and 16 columns do the same float work. The invariant order buys exactness with the
# one-column geometry for every column and the one-query attention kernel for every query: its verify
# cost grows faster with the width than a shared geometry's would, and past 8 tokens a second launch
# reads the weights again. What survives of the speed-up is in the two tables; the best draft length
# moves to where the invariant pass is still close to the cost of one token. `bench/NOTES_mmvq.md`
# records why, on an H200, a one-column mat-vec at full bandwidth and a cheap invariant 9-column pass
# pull the kernel in opposite directions.

# %%
# The claims of this notebook, checked.
assert SOURCE is not None, "no timing source: neither a GPU nor committed results"
assert matvec_plan(ReductionOrder.BATCH_INVARIANT, 9, "Q4_K").launches() == [(0, 5), (5, 4)]
assert all(matvec_plan(ReductionOrder.BATCH_INVARIANT, w, "Q4_K").nwarps == 4 for w in WIDTHS)
assert matvec_plan(ReductionOrder.BATCH_VARIANT, 9, "Q4_K").kernel == "mmq_stock"
for model, (removed, replaced) in REPLACED.items():  # "the reduction is not the price, the step is"
    assert replaced < 0.25 * removed, model
if STEPS:  # "a step is cheapest as a PDL launch; a one-counter barrier costs more and grows with the blocks"
    per = {(r["kind"], r["blocks"]): r["seconds_per_step"] for r in STEPS}
    blocks = sorted({b for _, b in per})
    assert all(per["launch chain, PDL", b] < per["persistent, grid barrier", b] for b in blocks)
    assert per["persistent, grid barrier", blocks[-1]] > per["persistent, grid barrier", blocks[0]]
if TAIL:  # "the last block costs more than a second launch; the tree barrier stays above a launch"
    assert all(pair[TAIL_KINDS[1], b] > pair[TAIL_KINDS[0], b] for _, b in pair)
    if STEPS:
        pdl = {r["blocks"]: 1e6 * r["seconds_per_step"] for r in STEPS if r["kind"] == "launch chain, PDL"}
        assert all(tree[b] > pdl[b] for b in tree if b in pdl)
if MATVEC:  # the prose on the committed per-order mat-vecs: exact orders keep a column's bits, the variant does not
    for shape, per_order in MATVEC.items():
        assert all(same for _, same in per_order["subblock"].values()), shape
        assert all(same for _, same in per_order["batch_invariant"].values()), shape
        assert not all(same for _, same in per_order["batch_variant"].values()), shape
        sub = per_order["subblock"]
        # nearly flat to 8 columns; the second n-tile (9..16) costs more than any width of one up to 5
        assert sub[8][0] < 1.4 * sub[1][0] and sub[9][0] > max(sub[w][0] for w in range(1, 6)), shape
        assert all(sub[w][0] <= min(p[w][0] for p in per_order.values()) for w in range(5, 17)), shape
        assert 0.75 <= sub[1][0] / per_order["batch_variant"][1][0] <= 1.35, shape
assert verify and all(ms > 0 for pw in verify.values() for ms in pw.values())
assert all(s > 0 for s, _ in speedup.values())
if ABLATION is not None:  # the norms cost more than SwiGLU, and the small launches are a real share
    by = {(r["model"], r["variant"]): r["saved_ms"] for r in ABLATION["rows"]}
    for model in {r["model"] for r in ABLATION["rows"]}:
        assert by[model, "no add+norm"] > by[model, "no swiglu"], model
        assert by[model, "mat-vecs only"] > 0, model
for order_name, r in MEASURED.items():  # an exact order's measured run must have matched plain decoding
    if order_name != "batch_variant":
        assert r["matches_plain"], order_name
print("all claims hold;", clock.summary())
