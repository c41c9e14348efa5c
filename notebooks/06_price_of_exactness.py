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
from pathlib import Path

import matplotlib.pyplot as plt
import numpy as np
from nbsupport import Stopwatch, device_name, load_model, model_path, show_file, warm_up

from hiraishin import ReductionOrder
from hiraishin.backends import get_backend
from hiraishin.plans import matvec_plan

ORDERS = (ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT, ReductionOrder.FIXED_SPLIT)
WIDTHS = list(range(1, 17))
RESULTS = Path.cwd().parent / "bench" / "results"  # the notebooks run from notebooks/
# colour and marker per order, the same in every figure (benchmark files name the orders shortly)
STYLES = {"variant": ("tab:red", "o"), "batch_variant": ("tab:red", "o"), "invariant": ("tab:blue", "s"),
          "batch_invariant": ("tab:blue", "s"), "invariant16": ("tab:green", "^"), "fixed_split": ("tab:green", "^")}
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
print(f"{'width':>5}  " + "  ".join(f"{o.name:<28}" for o in ORDERS))
for width in WIDTHS:
    cells = []
    for order in ORDERS:
        p = matvec_plan(order, width, "Q4_K")
        cells.append("tiled mat-mat" if p.kernel == "tiled" else
                     f"{p.nwarps} warps × launches {[n for _, n in p.launches()]}")
    print(f"{width:>5}  " + "  ".join(f"{cell:<28}" for cell in cells))
show_file("hiraishin.plans", "matvec.py", "def _balanced", after=4)

# %% [markdown]
# ## Measure: verify cost against width
#
# On a GPU: one forward pass of `w` tokens at a KV length of 256, median of repeats, every order.
# On the CPU: the newest committed `price-of-exactness.json` if there is one, else the mat-vec
# benchmark (`bench_mmvq.json`: Qwen3-8B's five mat-vec shapes, µs per call for 1–16 columns) and the
# attention benchmark (`bench_fattn.json`), each the newest by its recorded date.

# %%
def newest(name):
    """The newest committed result file called ``name`` (by the date it records), or None."""
    found = []
    for f in sorted(RESULTS.glob(f"*/{name}")):
        data = json.loads(f.read_text())
        meta = data.get("meta", data)
        found.append((str(meta.get("date", "")), f, data))
    return max(found, key=lambda t: (t[0], str(t[1])))[1:] if found else (None, None)


def time_passes(model, order, widths, repeats=5, kv=256):
    """Median seconds of one forward pass of ``w`` tokens after ``kv`` cached cells, per width."""
    out = {}
    model.reset()
    model.forward(list(range(kv)), 0, order=ReductionOrder.BATCH_INVARIANT)
    for w in widths:
        times = []
        for _ in range(repeats):
            model.rollback(kv)
            model.backend.synchronize()
            with clock(f"pass {order.name} {w}", quiet=True):
                model.forward([1] * w, kv, order=order)
                model.backend.synchronize()
            times.append(clock.seconds.pop(f"pass {order.name} {w}"))
        out[w] = float(np.median(times))
    return out


source = None
if LIVE:
    model = load_model(model_path(), n_ctx=512)
    with clock("JIT compilation (throwaway passes)"):
        warm_up(model, ORDERS, widths=(1, 2, 5, 9, 16))
    with clock("live timing"):
        verify = {o.name: time_passes(model, o, WIDTHS) for o in ORDERS}
    source = f"live, {model.name} on {device_name(be)}"
    panels = {"whole forward pass": {o: [verify[o][w] / verify[o][1] for w in WIDTHS] for o in verify}}
    absolute = {"whole forward pass": {o: [1e3 * verify[o][w] for w in WIDTHS] for o in verify}}
else:
    poe_path, poe = newest("price-of-exactness.json")
    mmvq_path, mmvq = newest("bench_mmvq.json")
    fattn_path, fattn = newest("bench_fattn.json")
    panels, absolute = {}, {}
    if poe is not None:
        source = str(poe_path.relative_to(RESULTS.parents[1]))
        for row in poe.get("rows", []):  # rows: order, width, seconds (or ms/us) of a verify pass
            t = row.get("seconds", row.get("ms", row.get("us")))
            absolute.setdefault(row.get("shape", "verify pass"), {}).setdefault(row["order"], {})[row["width"]] = t
        for shape, per_order in absolute.items():
            panels[shape] = {o: [per_order[o][w] / per_order[o][1] for w in sorted(per_order[o])] for o in per_order}
    elif mmvq is not None:
        source = str(mmvq_path.relative_to(RESULTS.parents[1]))
        for row in mmvq["results"]:
            shape = f"{row['shape']} ({row['qtype']})"
            absolute.setdefault(shape, {}).setdefault(row["order"], [None] * len(WIDTHS))[row["ncols"] - 1] = row["time_us"]
        for shape, per_order in absolute.items():
            panels[shape] = {o: [t / ts[0] for t in ts] for o, ts in per_order.items()}
    meta = (poe or mmvq or {}).get("meta", {})
    print("read:", source or "nothing (no committed results found)", "|", meta.get("device", "?"), meta.get("date", ""))
    print("the benchmark's own command:", meta.get("command", "?"))
SOURCE = source

# %%
if panels:
    n = len(panels)
    cols = min(n, 3)
    rows = -(-n // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.2 * cols, 3.2 * rows), squeeze=False, sharey=True,
                             layout="constrained")
    for ax, (shape, per_order) in zip(axes.flat, panels.items()):
        for order_name, ratios in per_order.items():
            color, marker = STYLES.get(order_name, ("k", "."))
            ax.plot(WIDTHS[:len(ratios)], ratios, marker=marker, ms=4, color=color, label=order_name)
        ax.axvline(8.5, color="k", ls=":", lw=1)
        ax.set_title(shape, fontsize=9)
        ax.set_xlabel("verify width (tokens)")
        ax.set_xticks([1, 4, 8, 12, 16])
        ax.set_yscale("log", base=2)  # the tiled stand-in's jump would flatten everything else
    for ax in axes[:, 0]:
        ax.set_ylabel("time ÷ time of 1 token")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    handles, labels = axes.flat[0].get_legend_handles_labels()
    if n < axes.size:  # an empty panel holds the legend, off the data
        axes.flat[n].legend(handles, labels, loc="center", title="order")
    else:
        fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    fig.suptitle(f"verify cost against width ({SOURCE})\ndotted: 8 columns, the mat-vec's launch limit")
    plt.show()
else:
    print("No committed GPU results are in this checkout, so there is nothing to plot on the CPU: run "
          "bench/bench_mmvq.py on a GPU (or this notebook there) to measure the price.")

# %% [markdown]
# How to read it: a flat line is free width, a line that climbs with the width is a price per column.
# `invariant` (launches of at most 8 columns) jumps at 9, where the weights are read a second time;
# `invariant16` is the same invariant geometry in one launch of up to 16 columns, which avoids that
# second read at the cost of more registers per thread. The variant order's tiled kernel past 8 is
# hiraishin's simple stand-in for llama.cpp's mat-mat, not a tuned kernel: its climb is not a price
# stock llama.cpp pays.
#
# Attention, from the attention benchmark (Qwen3-8B heads, 32/8), time per launch against the number of
# queries at each KV length:

# %%
if not LIVE and fattn is not None:
    kvs = sorted({r["kv_len"] for r in fattn["rows"]})
    fig, axes = plt.subplots(1, len(kvs), figsize=(3.4 * len(kvs), 3.2), layout="constrained")
    for ax, kv in zip(np.atleast_1d(axes), kvs):
        for order_name in ("batch_variant", "batch_invariant", "fixed_split"):
            rows_ = sorted((r for r in fattn["rows"] if r["order"] == order_name and r["kv_len"] == kv),
                           key=lambda r: r["n_queries"])
            color, marker = STYLES[order_name]
            ax.plot([r["n_queries"] for r in rows_], [r["us"] for r in rows_], marker=marker, ms=3, color=color,
                    label=order_name)
        ax.set_title(f"KV {kv} cells", fontsize=9)
        ax.set_xlabel("queries per launch")
    np.atleast_1d(axes)[0].set_ylabel("µs per launch")
    handles, labels = np.atleast_1d(axes)[0].get_legend_handles_labels()
    fig.legend(handles, labels, loc="outside right upper", fontsize="small")
    fig.suptitle(f"attention ({fattn_path.relative_to(RESULTS.parents[1])}, {fattn.get('device', '?')})")
    plt.show()
elif not LIVE:
    print("No committed attention benchmark (bench_fattn.json) in this checkout.")
else:
    print("On a GPU the live forward passes above include attention.")

# %% [markdown]
# At long KV lengths attention's price is plain to see: the invariant order runs every query of a
# verify pass through the one-query kernel, so its time grows with the number of queries, while the
# variant order's tile kernel handles 8 queries for the price of one launch. Fixed-size splits (two
# queries per block) sit in between. At 512 cells every launch costs the same few tens of µs: launch
# overhead, not work.
#
# ## What is left of the speed-up
#
# The measured end-to-end speed-up of exact speculative decoding per order comes from the benchmark
# of the whole decoder (`hiraishin-bench.json`), when one is committed:

# %%
bench_path, bench = newest("hiraishin-bench.json")
if bench is not None:
    print("read:", bench_path.relative_to(RESULTS.parents[1]))
    for row in bench.get("rows", bench.get("results", [])):
        print({k: row[k] for k in row if k in ("order", "draft", "n_draft", "speedup", "exact", "tokens_per_s")})
else:
    print("No hiraishin-bench.json is committed under bench/results/ yet, so there is no measured end-to-end "
          "speed-up to show; below is an estimate from the verify costs above, labelled as such.")

# %% [markdown]
# An estimate, from the standard model of greedy speculative decoding: with acceptance rate α per
# guess and `k` guesses per cycle, a cycle emits `(1 − α^(k+1)) / (1 − α)` tokens on average and costs
# `k` draft passes (each `c` times a target token) plus one verify pass of `k + 1` tokens. The verify
# pass's cost is what the orders change; weighting the measured mat-vec widths by Qwen3-8B's matrices
# (36 layers of q, k, v, o, gate, up, down, and the output head) gives it, mat-vecs only:

# %%
DRAFT_COST = 0.1  # a draft one tenth of the target's cost per token (Qwen3-0.6B drafting for Qwen3-8B)
ALPHAS = (0.6, 0.8, 0.9)
N_LAYERS_8B = 36
# calls per forward pass of each benchmarked shape (Qwen3-8B: q and o; k and v; gate and up; down; head)
CALLS = {"attn_q/attn_output": 2 * N_LAYERS_8B, "attn_k/attn_v": 2 * N_LAYERS_8B,
         "ffn_up/ffn_gate": 2 * N_LAYERS_8B, "ffn_down": N_LAYERS_8B, "output": 1}


def pass_cost(order_name):
    """Relative cost of a forward pass's mat-vecs at each width (1 = one token), from ``absolute``."""
    total = np.zeros(len(WIDTHS))
    for shape, per_order in absolute.items():
        calls = next((n for key, n in CALLS.items() if shape.startswith(key)), 1)
        total += calls * np.asarray(per_order[order_name], float)
    return total / total[0]


speedup = {}
if LIVE:
    cost = {o: np.array([verify[o][w] for w in WIDTHS]) / verify[o][1] for o in verify}
elif mmvq is not None and poe is None:
    cost = {o: pass_cost(o) for o in ("variant", "invariant", "invariant16")}
else:
    cost = {}
for order_name, rel in cost.items():
    for alpha in ALPHAS:
        best = max(((1 - alpha ** (k + 1)) / (1 - alpha) / (k * DRAFT_COST + rel[k]), k) for k in range(1, 16))
        speedup[order_name, alpha] = best
if speedup:
    print(f"estimated speed-up over plain decoding, best k (draft cost {DRAFT_COST} of a target token):")
    print(f"{'order':<16}" + "".join(f"{'α = ' + str(a):>18}" for a in ALPHAS))
    for order_name in cost:
        print(f"{order_name:<16}" + "".join(f"{speedup[order_name, a][0]:>11.2f}x (k={speedup[order_name, a][1]:>2})"
                                            for a in ALPHAS))
    print("(the variant order's figure is not an exact speed-up: its output is not plain decoding's)")

# %% [markdown]
# **Interpretation.** The variant order's verify pass is the cheapest, and it is not exact (notebooks
# 03 and 05). The invariant order buys exactness with the one-column geometry for every column: its
# verify cost grows faster with the width, and past 8 tokens a second launch reads the weights again.
# The estimate says how much of the speed-up survives; the best draft length moves down, to where the
# invariant pass is still close to the cost of one token. `bench/NOTES_mmvq.md` records why, on an
# H200, a one-column mat-vec at full bandwidth and a cheap invariant 9-column pass pull the kernel in
# opposite directions.

# %%
# The claims of this notebook, checked.
assert SOURCE is not None, "no timing source: neither a GPU nor committed results"
assert matvec_plan(ReductionOrder.BATCH_INVARIANT, 9, "Q4_K").launches() == [(0, 5), (5, 4)]
assert all(matvec_plan(ReductionOrder.BATCH_INVARIANT, w, "Q4_K").nwarps == 4 for w in WIDTHS)
assert matvec_plan(ReductionOrder.BATCH_VARIANT, 9, "Q4_K").kernel == "tiled"
for per_order in panels.values():
    for ratios in per_order.values():
        assert abs(ratios[0] - 1.0) < 1e-12 and all(r > 0 for r in ratios)
if speedup:
    assert all(s > 0 for s, _ in speedup.values())
print("all claims hold;", clock.summary())
