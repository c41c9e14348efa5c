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
# # 04 · Attention's parallel blocks
#
# Decoding one token attends one query per head over the whole KV cache. One CUDA block per head would
# leave most of a GPU idle, so llama.cpp's vector flash attention cuts the cache into 128-cell
# **chunks** spread over **P parallel blocks**: block `y` walks chunks `y, y+P, y+2P, …` with its own
# running max and sum, and a combine kernel merges the P partial softmaxes in block order. The
# grouping of the adds depends on P, and llama.cpp picks P from the KV length, the head count, the SM
# count and the occupancy of whichever kernel it launches — a verify batch of several queries even
# launches another kernel. The original report's symptom: outputs that agree with plain decoding up
# to position 384 and stop agreeing there.

# %%
import matplotlib.pyplot as plt
import numpy as np
from nbsupport import (
    Stopwatch,
    bits,
    device_name,
    emulator_module,
    load_model,
    model_path,
    show_function,
    show_source,
    warm_up,
)

from hiraishin import ReductionOrder
from hiraishin.backends import get_backend
from hiraishin.plans import CHUNK_CELLS, KV_PAD, AttentionPlan, attention_plan

VARIANT, INVARIANT, FIXED = ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT, ReductionOrder.FIXED_SPLIT
N_CELLS = 512
WRAP = 384  # first cell of the 4th chunk: where P = 3 and P = 4 stop grouping alike
clock = Stopwatch()
be = get_backend("auto")
print(f"backend {be.name} on {device_name(be)}; chunks of {CHUNK_CELLS} cells; KV range padded to {KV_PAD}")

# %% [markdown]
# ## The plan: chunks → blocks, P = 4 and P = 3 at 512 cells

# %%
plans = {P: AttentionPlan("vec", queries_per_block=1, parallel_blocks=P, kv_attended=N_CELLS) for P in (4, 3)}
for plan in plans.values():
    print(plan.describe(), "\n")

fig, axes = plt.subplots(2, 1, figsize=(9, 2.6), sharex=True, layout="constrained")
colors = plt.get_cmap("tab10")
for ax, (P, plan) in zip(axes, plans.items()):
    for y in range(P):
        for step, (a, b) in enumerate(plan.chunks_of_block(y)):
            ax.add_patch(plt.Rectangle((a, 0), b - a, 1, color=colors(y), alpha=0.7))
            ax.text((a + b) / 2, 0.5, f"block {y}" + (f", step {step}" if step else ""), ha="center", va="center")
    ax.axvline(WRAP, color="k", ls="--", lw=1)
    ax.set_ylim(0, 1)
    ax.set_yticks([0.5], [f"P = {P}"])
axes[-1].set_xlim(0, N_CELLS)
axes[-1].set_xticks(range(0, N_CELLS + 1, CHUNK_CELLS))
axes[-1].set_xlabel("KV cell")
axes[0].set_title(f"which block reads which chunk (dashed: cell {WRAP})")
plt.show()
CHUNK3_BLOCK = {P: plan.block_of_cell(WRAP) for P, plan in plans.items()}
print("the chunk from cell 384 is read by block", CHUNK3_BLOCK)

# %% [markdown]
# With P = 4 each chunk has a block of its own. With P = 3 the fourth chunk (cells 384–511) wraps to
# block 0, which folds it into its running max and sum *after* chunk 0, before the combine sees it.
#
# ## The kernel
#
# The chunk loop of `fattn_vec.cu` (P is the grid's y dimension; steps wholly past the filled cells are
# skipped, since their masked cells would change no bit), and the combine, which merges the P partials in
# block order:

# %%
show_source("attention", "fattn_vec.cu", "for (int c = y; c < n_chunks && c * chunk_cells < walk_end; c += P)",
            before=2, after=1)
show_source("attention", "fattn_vec.cu", "float kqmax = meta_sh[0];", after=8)

# %% [markdown]
# The emulator walks the same chunks (`c += n_blocks`) and merges in the same order:

# %%
att_emulate = emulator_module("attention")
show_function(att_emulate._vec_block, marker="while c < n_chunks", after=2)
show_function(att_emulate._combine_rows, marker="for l in range(P)", before=3, after=4)

# %% [markdown]
# ## Check: the position-384 effect on one launch
#
# One query per position 0..511 (causal: position `p` sees cells `0..p`), 2 heads sharing a KV head,
# random f16 K/V; the same launch under both plans:

# %%
def make_cache(seed, n_ctx, n_head=2, n_head_kv=1, head_dim=128):
    rng = np.random.default_rng(seed)
    q = rng.standard_normal((n_ctx, n_head, head_dim)).astype(np.float32)
    k = (1.5 * rng.standard_normal((n_ctx, n_head_kv, head_dim))).astype(np.float16)
    v = rng.standard_normal((n_ctx, n_head_kv, head_dim)).astype(np.float16)
    return q, be.to_device(k), be.to_device(v)


q, k, v = make_cache(seed=16, n_ctx=N_CELLS)
positions = np.arange(N_CELLS, dtype=np.int32)
with clock("JIT compilation + one launch per plan"):
    out = {P: be.to_host(be.flash_attn(be.to_device(q), k, v, be.to_device(positions),
                                       AttentionPlan("vec", 1, P, kv_attended=N_CELLS, kv_len=N_CELLS)))
           for P in (4, 3)}
same = np.all(bits(out[4]) == bits(out[3]), axis=(1, 2))
FIRST_OP_DIFF = int(np.argmin(same))
print(f"bit-identical below {WRAP}: {same[:WRAP].all()}; positions from {WRAP} on that differ: "
      f"{(~same[WRAP:]).sum()} of {N_CELLS - WRAP}; first differing position {FIRST_OP_DIFF}")

# %% [markdown]
# Below 384 chunk 3 is entirely masked: block 0 of P = 3 runs an all-masked chunk (its max stays, every
# weight is `exp(-inf) = 0`) and the empty block 3 of P = 4 enters the combine with weight 0 — both exact
# no-ops. From 384 on the chunk holds real cells, and the regrouping is real.
#
# The same exact no-op makes launches cheaper. Early in a generation the cache is short, yet the
# llama.cpp policies give a one-token step two parallel blocks at 33 cells: block 1's only chunk lies past
# the filled cells, so it sums nothing and enters the combine with weight 0. `AttentionPlan.launched()`
# drops such blocks, and with one block left the kernel normalises in place: no combine launch at all.
# The backends launch that plan (on the H200 it took 45-50 µs off a one-token pass of the 8B; see
# `bench/results/2026-12-04-h200-session19/`). The bits are the full plan's:

# %%
short = attention_plan(INVARIANT, 1, 33, 2, 1)
print(short.describe())
print(f"launched: {short.launched().parallel_blocks} block(s)")
q1, k1, v1 = make_cache(seed=3, n_ctx=33)
at32 = be.to_device(np.array([32], np.int32))
full = be.to_host(be.flash_attn(be.to_device(q1[32:]), k1, v1, at32, short))
trimmed = be.to_host(be.flash_attn(be.to_device(q1[32:]), k1, v1, at32, short.launched()))
print("bit-identical:", bool((bits(full) == bits(trimmed)).all()))
assert short.parallel_blocks == 2 and (bits(full) == bits(trimmed)).all()

# %% [markdown]
# ## A model replay past 384, with the policy's real plans
#
# Now the whole model. What the policies give one decode step and one verify pass at 400 cells:

# %%
path = model_path()
model = load_model(path, n_ctx=640)
c = model.config
for order in (VARIANT, INVARIANT):
    for nq in (1, 2, 9):
        p = attention_plan(order, nq, 400, c.n_head, c.n_head_kv, c.head_dim)
        split = f"contiguous {p.split_cells}-cell splits" if p.kernel == "tile" else "interleaved 128-cell chunks"
        print(f"{order.name:<16} {nq} quer{'y' if nq == 1 else 'ies'}: {p.kernel_name:<13} P={p.parallel_blocks:<3} {split}")
with clock("JIT compilation (throwaway passes)"):
    warm_up(model, (VARIANT, INVARIANT), widths=(1, 2, 16))

# %% [markdown]
# The variant policy sends a verify batch to the multi-query tile kernel, which splits the cache into
# contiguous ranges and orders everything differently; the invariant policy keeps the one-query kernel
# and the one-query P for every query of the batch. The tile kernel's ordering, for comparison:

# %%
show_source("attention", "fattn_tile.cu", "const int begin = y * split_cells;", after=2)

# %% [markdown]
# Replay a sequence that crosses 384 cells. Any tokens will do (replay compares logits, not
# text), so a seeded random sequence stands in for a long prompt; positions before `START` are a shared
# prefix fed once and not compared. Batches of 2 keep the mat-vec's one-column warp count, so under
# `BATCH_VARIANT` what differs is attention's kernel choice alone.

# %%
START, STOP = 368, 456  # 16 positions below 384, 72 from it on
seq = np.random.default_rng(1).integers(0, c.n_vocab, STOP).tolist()
replays = {}
for order, sizes in ((VARIANT, [2]), (INVARIANT, [9])):
    with clock(f"replay {order.name}"):
        replays[order.name] = model.replay(seq, sizes, order=order, start=START)
    print(replays[order.name], "\n")
rv = replays[VARIANT.name]
first = rv[2].first_diff
print("BATCH_VARIANT, batch 2:", f"first difference at position {first}" if first is not None else
      "no logit differs at any position: see below for where the attention differences went")

# %% [markdown]
# The position-384 effect itself, on the model: decode the same positions one token at a time under two
# custom orders that differ only in P (3 and 4), recording every op (`record=`), from `START` to
# `P_STOP`. The shared prefix below 384 is the same bits under both (as the launch above showed), so it
# is fed once:

# %%
P_STOP = 424  # 16 positions below 384, 40 from it on
P4 = ReductionOrder.custom("P4", parallel_blocks=4)
P3 = ReductionOrder.custom("P3", parallel_blocks=3)
ATTN = "blk.0.attn"  # the first layer's attention output, before the next mat-vec quantizes it
with clock("one-token decoding under P = 4 and P = 3"):
    model.reset()
    model.forward(seq[:START], 0, order=P4)  # custom P: every query walks the same plan, any batch
    logits, attn = {}, {}
    for order in (P4, P3):
        model.rollback(START)
        rows, outs = [], []
        for p in range(START, P_STOP):
            rec = {}
            rows.append(np.asarray(model.forward([seq[p]], p, order=order, record=rec))[0])
            outs.append(np.asarray(rec[ATTN])[0].reshape(-1))  # (heads x head_dim) of the one token
        logits[order.name], attn[order.name] = np.stack(rows), np.stack(outs)
pos = np.arange(START, P_STOP)
attn_same = np.all(bits(attn["P4"]) == bits(attn["P3"]), axis=1)
model_same = np.all(bits(logits["P4"]) == bits(logits["P3"]), axis=1)
FIRST_ATTN_DIFF = int(pos[np.argmin(attn_same)]) if not attn_same.all() else None
FIRST_MODEL_DIFF = int(pos[np.argmin(model_same)]) if not model_same.all() else None
print(f"{ATTN}: bit-identical below {WRAP}: {attn_same[pos < WRAP].all()}; from {WRAP} on, "
      f"{(~attn_same[pos >= WRAP]).sum()} of {(pos >= WRAP).sum()} positions differ (first: {FIRST_ATTN_DIFF})")
print(f"logits:     bit-identical below {WRAP}: {model_same[pos < WRAP].all()}; from {WRAP} on, "
      f"{(~model_same[pos >= WRAP]).sum()} of {(pos >= WRAP).sum()} positions differ (first: {FIRST_MODEL_DIFF})")

fig, ax = plt.subplots(figsize=(9, 3.2), layout="constrained")
d_attn = np.abs(attn["P4"].astype(np.float64) - attn["P3"]).max(axis=1)
d_logit = np.abs(logits["P4"].astype(np.float64) - logits["P3"]).max(axis=1)
ax.plot(pos, d_attn, drawstyle="steps-mid", color="tab:orange", label=f"{ATTN}, P = 3 vs P = 4")
ax.plot(pos, d_logit, drawstyle="steps-mid", color="tab:red", label="logits, P = 3 vs P = 4")
d2 = np.asarray(rv[2].diff_by_position)
ax.plot(np.asarray(rv.positions), d2, drawstyle="steps-mid", color="tab:blue", alpha=0.7,
        label="logits, BATCH_VARIANT batch of 2")
ax.axvline(WRAP, color="k", ls="--", lw=1)
ax.set_yscale("symlog", linthresh=1e-8)
ax.set_ylim(bottom=0)
ax.set_xlabel("position (= KV cells seen − 1)")
ax.set_ylabel("max |Δ|")
if d_logit.max() == 0 and d2.max() == 0:  # say so, rather than leave two lines hidden on the axis
    ax.text(0.98, 0.08, "both logit curves: 0, bit-identical at every position", transform=ax.transAxes,
            ha="right", color="tab:green")
ax.set_title(f"the model at cell {WRAP} (dashed): attention output and logits")
ax.legend(loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize="small")
plt.show()

# %% [markdown]
# From 384 on the attention output differs at every position, as on the single launch. Whether the
# *logits* follow depends on the next mat-vec: it quantizes the attention output to int8 (q8_1) first,
# and a value that moved by an ulp rounds to the same int8 unless it sat within an ulp of a rounding
# boundary. With this model's two heads (256 attention values per layer) that is rare, so few or no
# logits move; a real Qwen3 has 4,096 values per layer in 36 layers, and once one rounding flips, the
# changed K/V of the next layer reaches every later position. The same filter explains the variant
# replay's batch of 2: its tile kernel sums everything differently, and yet few logits move here.
#
# ## The fix, and the 256-cell guard
#
# `BATCH_INVARIANT` always launches the one-query kernel and sizes P from the count of ONE query: the
# batch width cannot change the plan. One input is left: the attended range. A verify pass over
# positions `p .. p+n-1` attends `p+n` cells padded to 256, while position `p` decoded alone attended
# `p+1` cells padded to 256. A pass that straddles a multiple of 256 plans its early queries with more
# chunks, and more chunks can mean another P. Whether that regroups the chunks a query sees depends on
# the profile's efficiency loop; search the boundaries, for this model's heads and for 2/1 heads:

# %%
def visible_grouping(plan, p):
    """The chunks a query at ``p`` sees, grouped by block, in block order (empty groups dropped)."""
    groups = [[a for a, _ in plan.chunks_of_block(y) if a <= p] for y in range(plan.parallel_blocks)]
    return [g for g in groups if g]


def regrouping_boundaries(n_head, n_head_kv, up_to=4096):
    hits = []
    for boundary in range(KV_PAD, up_to + 1, KV_PAD):
        below = attention_plan(INVARIANT, 1, boundary, n_head, n_head_kv)  # decoded alone, just below
        above = attention_plan(INVARIANT, 1, boundary + 1, n_head, n_head_kv)  # a pass that crossed it
        if any(visible_grouping(below, p) != visible_grouping(above, p) for p in range(boundary - 8, boundary)):
            hits.append((boundary, below.parallel_blocks, above.parallel_blocks))
    return hits


print(f"this model ({c.n_head}/{c.n_head_kv} heads):", regrouping_boundaries(c.n_head, c.n_head_kv) or "none")
HITS = regrouping_boundaries(2, 1)
print("2/1 heads:", HITS, "(boundary, P below, P above)")

# %% [markdown]
# Take the first such boundary and run 16 positions around it three ways: each alone (plain decoding),
# one pass straddling the boundary, and the same positions cut where `order.verify_limit` cuts them:

# %%
show_function(ReductionOrder.verify_limit)
B = HITS[0][0]
qg, kg, vg = make_cache(seed=7, n_ctx=B + 16)
around = np.arange(B - 8, B + 8)


def attend(ps, order):
    """One launch for consecutive positions ``ps`` (kv_len = last + 1), planned by ``order``."""
    ps = np.asarray(ps, np.int32)
    return be.to_host(be.attention(be.to_device(qg[ps]), kg, vg, be.to_device(ps), int(ps[-1]) + 1, order))


with clock("guard check"):
    alone = np.concatenate([attend([p], INVARIANT) for p in around])
    straddling = attend(around, INVARIANT)
    n_first = INVARIANT.verify_limit(int(around[0]), len(around))
    guarded = np.concatenate([attend(around[:n_first], INVARIANT), attend(around[n_first:], INVARIANT)])
    fixed_alone = np.concatenate([attend([p], FIXED) for p in around])
    fixed_straddling = attend(around, FIXED)
match = {name: np.all(bits(got) == bits(ref), axis=(1, 2)) for name, got, ref in (
    ("one pass straddling the boundary", straddling, alone),
    ("cut at the boundary (the guard)", guarded, alone),
    ("FIXED_SPLIT, one straddling pass", fixed_straddling, fixed_alone))}
print(f"verify_limit({around[0]}, {len(around)}) = {n_first}: the pass is cut at cell {around[0] + n_first}")
for name, m in match.items():
    print(f"{name:<34} positions equal to decoding alone: {m.sum()}/{len(m)} (below {B}: {m[around < B].sum()}/8)")

# %% [markdown]
# The straddling pass reproduces plain decoding only past the boundary; its early queries come out with
# the other P. Cut at the boundary, every position matches: that is all the guard does, at the price of
# an occasional shorter verify pass. **Fixed-size splits** (`FIXED_SPLIT`, the approach of SGLang's
# deterministic mode and Thinking Machines' kernels) are the other way out: blocks start at fixed cells,
# so a longer range only adds blocks past the end, which a query never sees — no guard needed, at the
# price of a P that does not adapt to the GPU.
#
# **Interpretation.** Attention's order has two inputs the batch can move: the kernel (one query or
# many) and, through the padded range, P. The variant policy lets both move; the invariant policy pins
# the first and guards the second; fixed splits remove the second.

# %%
# The claims of this notebook, checked.
assert CHUNK3_BLOCK == {4: 3, 3: 0}
assert same[:WRAP].all() and not same[WRAP:].all() and FIRST_OP_DIFF >= WRAP
assert replays[INVARIANT.name].identical
assert attn_same[pos < WRAP].all() and not attn_same[pos >= WRAP].any() and FIRST_ATTN_DIFF == WRAP
assert model_same[pos < WRAP].all()
assert HITS and not match["one pass straddling the boundary"].all()
assert match["cut at the boundary (the guard)"].all() and match["FIXED_SPLIT, one straddling pass"].all()
print("all claims hold;", clock.summary())
