"""Write the teaching notebooks (``notebooks/*.ipynb``) from the cell lists below, outputs stripped.

    python notebooks/make_notebooks.py            # rewrite the .ipynb files
    python notebooks/make_notebooks.py --check    # exit 1 if a committed notebook differs

Each notebook follows the Triton-tutorial shape (motivate, show, check, measure, interpret), runs on
the CPU backend (the bit-exact Numba emulator) and unchanged on a GPU (``get_backend("auto")`` /
``device="auto"``), is seeded, and executes in well under a minute on two CPU cores.
``tests/test_notebooks.py`` executes them. Prose never states a measured number: the code prints
it, the prose says what to look for.
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import nbformat

HERE = Path(__file__).resolve().parent

KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def md(text: str) -> tuple[str, str]:
    return "markdown", textwrap.dedent(text).strip("\n")


def code(text: str) -> tuple[str, str]:
    return "code", textwrap.dedent(text).strip("\n")


# ------------------------------------------------------------------------------------------------
# 01: float addition is not associative

NB01 = [
    md("""
    # 01 · Float addition is not associative

    Greedy speculative decoding promises the big model's exact output: a drafted token survives only
    if it equals the model's own argmax. That holds only if a position's logits inside a verify batch
    of several tokens are *bit-identical* to its logits when it is decoded alone. On stock llama.cpp
    kernels they are not, and the reason fits in one line: float32 addition rounds after every add,
    so **the same numbers summed in a different grouping give different bits**.

    This notebook goes from a few lines of numpy to the quantized mat-vec kernel:

    1. one sum, four orders: sequential, 4-way and 2-way interleaved, butterfly;
    2. the mat-vec *plan*: which thread and which warp sums which Q4_K super-block, for a batch of 1 and of 5;
    3. the mat-vec itself on random Q4_K weights (K = 4096), batch of 1 vs batch of 5, under
       `BATCH_VARIANT` and `BATCH_INVARIANT`;
    4. when the warp count matters at all (it depends on the row length).

    Everything runs on the CPU backend (a Numba emulator that performs the CUDA kernel's float32
    operations in the kernel's order) or, when CuPy sees a GPU, on the CUDA kernels themselves.
    """),
    code("""
    import math

    import matplotlib.pyplot as plt
    import numpy as np

    from hiraishin import ReductionOrder
    from hiraishin.backends import get_backend
    from hiraishin.kernels.mmvq import random_weights

    VARIANT, INVARIANT = ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT
    be = get_backend("auto")  # "cuda" when CuPy sees a GPU, else "cpu" (the bit-exact emulator)
    print("backend:", be.name)
    rng = np.random.default_rng(0)
    """),
    md("""
    ## 1. One sum, four orders

    Four ways to add the same 4,096 float32 numbers, each a correct float32 sum:

    * **sequential**: one accumulator, left to right;
    * **4-way / 2-way interleaved**: element `i` goes to accumulator `i % k` (as if `k` threads each
      walked every `k`-th element), then the `k` partial sums are added in order;
    * **butterfly**: add the upper half onto the lower half until one value is left, which is what a
      warp's xor-shuffle reduction (offsets 16, 8, 4, 2, 1) does.

    The numbers span a few decades of magnitude, as activations and weight products do.
    """),
    code("""
    def sequential(v):
        acc = np.float32(0.0)
        for a in v:
            acc = np.float32(acc + a)
        return acc


    def interleaved(v, k):
        partials = np.array([sequential(v[j::k]) for j in range(k)], dtype=np.float32)
        return sequential(partials)


    def butterfly(v):
        v = np.array(v, dtype=np.float32)
        while len(v) > 1:
            half = len(v) // 2
            v = v[:half] + v[half:]  # float32 + float32 -> float32, one rounding per add
        return v[0]


    def ordered(a):
        \"\"\"float32 bit patterns mapped to integers in the order of the floats (adjacent floats differ by 1).\"\"\"
        i = np.asarray(a, dtype=np.float32).view(np.int32).astype(np.int64)
        return np.where(i < 0, -(i & 0x7FFFFFFF), i)


    def ulps(a, b):
        \"\"\"Distance between float32 values in units in the last place.\"\"\"
        return np.abs(ordered(a) - ordered(b))


    x = (rng.standard_normal(4096) * np.exp(rng.uniform(-4, 4, 4096))).astype(np.float32)
    exact = math.fsum(float(a) for a in x)  # the exact sum, correctly rounded to float64
    sums = {
        "sequential": sequential(x),
        "4-way interleaved": interleaved(x, 4),
        "2-way interleaved": interleaved(x, 2),
        "butterfly": butterfly(x),
        "np.sum (pairwise)": np.sum(x),
    }
    print(f"{'order':<20} {'float32 sum':>16} {'bits':>10} {'ulps from sequential':>21} {'error vs exact':>15}")
    for name, s in sums.items():
        bits = int(np.float32(s).view(np.uint32))
        print(f"{name:<20} {float(s):>16.9g} {bits:>#10x} {int(ulps(s, sums['sequential'])):>21} "
              f"{float(s) - exact:>15.3g}")
    """),
    md("""
    Read the `bits` column: the orders agree in the leading digits and disagree in the last bits.
    None of them is "the right one": each carries its own accumulated rounding error (last column),
    and which order lands closest to the exact sum is luck. What matters here is only that the bits
    *depend on the grouping*. `np.sum` is one more order: numpy sums float32 arrays pairwise in blocks,
    so it may coincide with one of ours or with none.

    How often do two orders disagree? Count it over many random vectors:
    """),
    code("""
    trials = 2000
    disagree = {"4-way vs 2-way": 0, "4-way vs butterfly": 0, "sequential vs butterfly": 0}
    for _ in range(trials):
        v = (rng.standard_normal(64) * np.exp(rng.uniform(-4, 4, 64))).astype(np.float32)
        a, b, c, d = interleaved(v, 4), interleaved(v, 2), butterfly(v), sequential(v)
        disagree["4-way vs 2-way"] += a != b
        disagree["4-way vs butterfly"] += a != c
        disagree["sequential vs butterfly"] += d != c
    for name, n in disagree.items():
        print(f"{name:<24} differ in {n / trials:.1%} of {trials} sums of 64 numbers")
    """),
    md("""
    Disagreement is not a rare corner case: for sums of a few dozen numbers of mixed magnitude it is
    the common case. A GPU kernel that changes its grouping with the batch size will therefore
    change the bits of almost every output.

    ## 2. The mat-vec plan: who sums what

    llama.cpp's quantized mat-vec (`mul_mat_vec_q`) sums each output row inside one CUDA block. For Q4_K
    weights, 16 threads share one 256-value *super-block*; thread `t` walks super-blocks `t // 16`,
    `t // 16 + blocks_per_iteration`, … and accumulates its share of each. Then the warps hand their
    partial sums to warp 0 through shared memory, and a 32-lane butterfly finishes the row.
    The number of warps comes from a table keyed by the number of columns (tokens) in the batch.
    In hiraishin that choice is data: a `ReductionOrder` turns the shape of a call into a `MatVecPlan`.
    """),
    code("""
    for ncols in (1, 5):
        plan = VARIANT.matvec_plan(ncols=ncols, qtype="Q4_K")
        print(f"BATCH_VARIANT, ncols={ncols}:\\n  {plan.describe()}\\n")
    print(f"BATCH_INVARIANT, ncols=5:\\n  {INVARIANT.matvec_plan(ncols=5, qtype='Q4_K').describe()}")
    """),
    md("""
    Same kernel, same weights, same arithmetic per super-block; what differs between one column and
    five under the variant order is the warp count, hence which thread's accumulator each super-block
    lands in, and how many partials the hand-over adds. `thread_blocks(n)` lists, per thread, the
    super-blocks it sums, in order. The 16 threads that share a super-block always move together, so
    the picture below draws one row per group of 16 threads (a half-warp) over the 16 super-blocks of
    a K = 4096 row; the number in a cell is the iteration in which that group reaches the super-block.
    """),
    code("""
    def draw_plan(ax, plan, n_blocks):
        tpb = plan.traits.threads_per_block
        groups = {}
        for tid, blocks in plan.thread_blocks(n_blocks).items():
            groups.setdefault(tid // tpb, blocks)  # every thread of a group walks the same blocks
        colors = plt.get_cmap("tab10")
        for g, blocks in groups.items():
            warp = g * tpb // 32
            for it, kbx in enumerate(blocks):
                ax.add_patch(plt.Rectangle((kbx, g), 1, 1, color=colors(warp), alpha=0.75))
                ax.text(kbx + 0.5, g + 0.5, str(it), ha="center", va="center", fontsize=8)
        labels = [f"warp {g * tpb // 32}, threads {g * tpb}-{g * tpb + tpb - 1}" for g in groups]
        ax.set_yticks(np.arange(len(groups)) + 0.5, labels, fontsize=8)
        ax.set_xticks(np.arange(n_blocks) + 0.5, range(n_blocks), fontsize=8)
        ax.set_xlim(0, n_blocks)
        ax.set_ylim(len(groups), 0)
        ax.set_xlabel("Q4_K super-block of the row (256 values each)")
        ax.set_title(f"{plan.nwarps} warps ({plan.ncols} column{'s' if plan.ncols > 1 else ''}): "
                     f"{plan.blocks_per_iter} super-blocks per iteration", fontsize=10)


    K = 4096
    n_blocks = K // 256
    fig, axes = plt.subplots(2, 1, figsize=(9, 6.5), height_ratios=[8, 4], layout="constrained")
    for ax, ncols in zip(axes, (1, 5)):
        draw_plan(ax, VARIANT.matvec_plan(ncols=ncols, qtype="Q4_K"), n_blocks)
    plt.show()
    """),
    md("""
    With 4 warps every half-warp sums two super-blocks and the hand-over adds four warp partials per
    lane; with 2 warps every half-warp sums four super-blocks and the hand-over adds two. Follow one
    super-block, say the fifth, through both pictures: its contribution meets the others in a different
    accumulator and at a different step. From section 1 we know what that does to the bits.

    ## 3. Check: the mat-vec, batch of 1 vs batch of 5

    Random *valid* Q4_K weights (512 rows × 4096 columns) times five random activation columns. Each
    column is quantized to q8_1 on its own, so column 0 enters the kernel with identical bytes whether
    it travels alone or with four others; only the plan differs.
    """),
    code("""
    N = 512
    w_host = random_weights("Q4_K", N, K, seed=0)
    w = be.upload_weight(w_host)
    x5 = rng.standard_normal((5, K)).astype(np.float32)


    def matvec(x, order, backend=be, weight=w):
        \"\"\"(ncols, K) float32 activations times the weight, planned by ``order``: float32 (ncols, N) on the host.\"\"\"
        return backend.to_host(backend.mul_mat(weight, "Q4_K", backend.to_device(x), order))


    def bits(a):
        return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


    alone_v = matvec(x5[:1], VARIANT)[0]
    batch_v = matvec(x5, VARIANT)
    differ = bits(alone_v) != bits(batch_v[0])
    d_ulps = ulps(alone_v, batch_v[0])
    print(f"BATCH_VARIANT: column 0 alone vs in a batch of 5: {differ.sum()} of {N} outputs differ in their bits")
    print(f"  largest difference {np.abs(alone_v - batch_v[0]).max():.3g} "
          f"(outputs are of size {np.abs(alone_v).mean():.3g} on average), at most {d_ulps.max()} ulps")
    per_col = [int((bits(matvec(x5[j:j + 1], VARIANT)[0]) != bits(batch_v[j])).sum()) for j in range(5)]
    print("  outputs that differ, per column of the batch:", per_col)

    alone_i = matvec(x5[:1], INVARIANT)[0]
    batch_i = matvec(x5, INVARIANT)
    print("BATCH_INVARIANT: column 0 alone == in a batch of 5, bit for bit:",
          np.array_equal(bits(alone_i), bits(batch_i[0])))
    print("BATCH_INVARIANT batch == BATCH_VARIANT one column, bit for bit:",
          np.array_equal(bits(batch_i), bits(np.stack([matvec(x5[j:j + 1], VARIANT)[0] for j in range(5)]))))
    """),
    code("""
    fig, (ax0, ax1) = plt.subplots(1, 2, figsize=(10.5, 3.6), layout="constrained")
    edges = [0, 1, 2, 3, 5, 9, 17, 65, np.inf]
    labels = ["0", "1", "2", "3-4", "5-8", "9-16", "17-64", ">64"]
    counts = [int(((d_ulps >= lo) & (d_ulps < hi)).sum()) for lo, hi in zip(edges[:-1], edges[1:])]
    ax0.bar(labels, counts, color=["tab:green"] + ["tab:red"] * (len(labels) - 1))
    ax0.set_xlabel("ulps between column 0 alone and in the batch of 5")
    ax0.set_ylabel(f"outputs (of {N})")
    ax0.set_title("BATCH_VARIANT: how far the bits move")
    size, moved = np.abs(alone_v[differ]), np.abs(alone_v - batch_v[0])[differ]
    ax1.loglog(size, moved, ".", color="tab:red", ms=4, label="outputs that differ")
    grid = np.logspace(np.log10(size.min()), np.log10(np.abs(alone_v).max()), 50).astype(np.float32)
    ax1.loglog(grid, np.spacing(grid), "k--", lw=1, label="1 ulp of the output")
    ax1.set_xlabel("|output|")
    ax1.set_ylabel("|alone - batched|")
    ax1.set_title("absolute difference vs output size")
    ax1.legend(fontsize="small")
    plt.show()
    """),
    md("""
    The left panel is the whole bug at kernel scale: most outputs that differ move by an ulp or a few.
    The right panel explains the long tail. The dashed line is one ulp of the output itself; the
    points far above it are small outputs, the result of partial sums much larger than the output
    cancelling each other. What moves is the rounding of those partials, so the absolute difference
    barely depends on the output's size, and small outputs see it as many ulps.

    The fix: `BATCH_INVARIANT` gives every column the one-column geometry (4 warps here), so a
    column's bits cannot depend on its neighbours, and the invariant batch reproduces the variant
    order's one-column result exactly. The fix costs no accuracy; it picks one order and keeps it.
    """),
    code("""
    if be.name == "cuda":
        # On a GPU: the CPU emulator must reproduce the kernel's bits (same float ops, same order).
        cpu = get_backend("cpu")
        emulated = matvec(x5, VARIANT, backend=cpu, weight=w_host)
        print("GPU kernel == CPU emulator, bit for bit:", np.array_equal(bits(batch_v), bits(emulated)))
    else:
        print("CPU backend: these bits are what the CUDA kernel computes for the same plan.")
    """),
    md("""
    ## 4. Measure: when does the warp count matter?

    Not every row length exposes the switch. If a row has few super-blocks, every half-warp sums at
    most one of them under both geometries and the hand-over adds the same partials in the same order
    (empty threads add exact zeros). Sweep the row length, including awkward ones, and count how many
    of 256 outputs change between a batch of 1 and a batch of 5 under `BATCH_VARIANT`:
    """),
    code("""
    sweep = list(range(1, 13))  # super-blocks per row: K = 256 ... 3072
    changed = []
    for nb in sweep:
        wk = be.upload_weight(random_weights("Q4_K", 256, 256 * nb, seed=nb))
        xk = rng.standard_normal((5, 256 * nb)).astype(np.float32)
        one = matvec(xk[:1], VARIANT, weight=wk)[0]
        five = matvec(xk, VARIANT, weight=wk)[0]
        changed.append(int((bits(one) != bits(five)).sum()))
    first = next((nb for nb, c in zip(sweep, changed) if c), None)
    print("outputs (of 256) that change, by super-blocks per row:", dict(zip(sweep, changed)))
    print("first row length where 4 vs 2 warps changes bits:",
          None if first is None else f"{first} super-blocks (K = {256 * first})")

    fig, ax = plt.subplots(figsize=(8, 3), layout="constrained")
    ax.bar([256 * nb for nb in sweep], changed, width=180, color="tab:red")
    ax.set_xticks([256 * nb for nb in sweep], [str(256 * nb) for nb in sweep], fontsize=8)
    ax.set_xlabel("row length K")
    ax.set_ylabel("outputs that change")
    ax.set_title("BATCH_VARIANT, Q4_K: batch of 1 vs batch of 5")
    plt.show()
    """),
    md("""
    Below the printed threshold the two plans build the same sum tree and the bits agree although
    the warp count differs; from there on most outputs change. Real models have rows of thousands of
    values (Qwen3-8B: K = 4096 and 12288), far past it. Keep this in mind for notebook 03: the
    synthetic micro model's rows are short.

    Any geometry can be asked for explicitly, for teaching: `ReductionOrder.custom(nwarps=3)` is a
    plan llama.cpp never uses. Is it equal to either of the others?
    """),
    code("""
    three = ReductionOrder.custom("three_warps", nwarps=3)
    print(three.matvec_plan(ncols=1, qtype="Q4_K").describe())
    y3 = matvec(x5[:1], three)[0]
    print("3 warps vs 4 warps: outputs that differ:", int((bits(y3) != bits(alone_v)).sum()), "of", N)
    print("3 warps vs 2 warps: outputs that differ:", int((bits(y3) != bits(batch_v[0])).sum()), "of", N)
    print("3 warps, batch of 1 vs batch of 5, bit for bit:",
          np.array_equal(bits(y3), bits(matvec(x5, three)[0])))
    """),
    md("""
    A third grouping, a third set of bits, and — because a custom order pins the geometry for every
    batch — still batch-invariant. Invariance is not about finding *the* correct order; it is about
    not letting the batch size choose one.

    **Next:** notebook 02 does the same for attention, where the grouping depends on the KV length too.
    """),
]


# ------------------------------------------------------------------------------------------------
# 02: split-KV attention and position 384

NB02 = [
    md("""
    # 02 · Split-KV attention and position 384

    Decoding one token attends one query per head over the whole KV cache. One CUDA block per head
    would leave most of a GPU idle, so llama.cpp's vector flash-attention kernel splits the cache into
    128-cell *chunks* spread over `P` parallel blocks: block `y` walks chunks `y, y+P, y+2P, …`
    keeping its own running max and sum, and a combine kernel merges the `P` partial softmaxes in block
    order. The merge regroups the float adds, so the bits depend on `P` — and stock llama.cpp picks
    `P` from the KV length, the head count, the SM count and the occupancy of whichever kernel it
    launches.

    This notebook: the plan (`AttentionPlan`), a picture of chunks → blocks for `P = 3` and `P = 4`,
    the *position-384 effect* reproduced with `flash_attn`, the variant policy's `P` per KV length on
    the H200 profile, and why the invariant policy stops verify batches at multiples of 256 cells.
    """),
    code("""
    import matplotlib.pyplot as plt
    import numpy as np

    from hiraishin import ReductionOrder
    from hiraishin.backends import get_backend
    from hiraishin.devices import get_profile
    from hiraishin.kernels.fattn_vec import CHUNK_CELLS, AttentionPlan, flash_attn

    VARIANT, INVARIANT = ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT
    be = get_backend("auto")  # "cuda" when CuPy sees a GPU, else "cpu" (the bit-exact emulator)
    print("backend:", be.name, "| chunk:", CHUNK_CELLS, "cells")


    def bits(a):
        return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


    def make_cache(seed, n_ctx, n_head=2, n_head_kv=1, head_dim=128):
        \"\"\"One float32 query per position and an f16 KV cache of n_ctx cells (the micro model's heads).\"\"\"
        rng = np.random.default_rng(seed)
        q = rng.standard_normal((n_ctx, n_head, head_dim)).astype(np.float32)
        k = (1.5 * rng.standard_normal((n_ctx, n_head_kv, head_dim))).astype(np.float16)
        v = rng.standard_normal((n_ctx, n_head_kv, head_dim)).astype(np.float16)
        return q, k, v


    def run_plan(q, k, v, q_pos, plan):
        \"\"\"One attention launch with an explicit plan, on this backend; float32 (T, n_head, D) on the host.\"\"\"
        out = flash_attn(q, be.to_device(k), be.to_device(v), np.asarray(q_pos, np.int32), plan, be.name)
        return be.to_host(out)
    """),
    md("""
    ## 1. The plan: chunks → parallel blocks

    An `AttentionPlan` names the kernel, the number of parallel blocks `P`, the chunk size and the
    attended range (llama.cpp pads the KV length to a multiple of 256 cells). `chunks_of_block(y)`
    lists the cell ranges block `y` walks, in order.
    """),
    code("""
    n_cells = 512
    plans = {P: AttentionPlan("vec", queries_per_block=1, parallel_blocks=P, kv_attended=n_cells) for P in (3, 4)}
    for P, plan in plans.items():
        print(plan.describe(), "\\n")
    print("P=3, block 0 walks:", plans[3].chunks_of_block(0))
    """),
    code("""
    fig, axes = plt.subplots(2, 1, figsize=(9, 2.8), layout="constrained", sharex=True)
    colors = plt.get_cmap("tab10")
    for ax, (P, plan) in zip(axes, plans.items()):
        for y in range(P):
            for step, (a, b) in enumerate(plan.chunks_of_block(y)):
                ax.add_patch(plt.Rectangle((a, 0), b - a, 1, color=colors(y), alpha=0.7))
                ax.text((a + b) / 2, 0.5, f"block {y}" + (f" (step {step})" if step else ""),
                        ha="center", va="center", fontsize=9)
        ax.axvline(384, color="k", ls="--", lw=1)
        ax.set_ylim(0, 1)
        ax.set_yticks([])
        ax.set_ylabel(f"P = {P}", rotation=0, labelpad=25)
    axes[-1].set_xlim(0, n_cells)
    axes[-1].set_xticks(range(0, n_cells + 1, CHUNK_CELLS))
    axes[-1].set_xlabel("KV cell")
    axes[0].set_title("which parallel block reads which 128-cell chunk (dashed: cell 384)")
    plt.show()
    """),
    md("""
    With `P = 4` every chunk has a block of its own. With `P = 3` the fourth chunk (cells 384–511)
    wraps around to block 0, which walks it *after* chunk 0 and folds it into its running max and sum
    before the combine sees anything. So the two plans group the same adds differently — but only for
    a query that can see cells of the last chunk.

    ## 2. Check: the position-384 effect

    One query per position 0..511 (causal: position `p` sees cells `0..p`), two heads sharing one KV
    head, run through both plans:
    """),
    code("""
    q, k, v = make_cache(seed=16, n_ctx=n_cells)
    q_pos = np.arange(n_cells)
    out = {P: run_plan(q, k, v, q_pos, AttentionPlan("vec", 1, P, kv_attended=n_cells, kv_len=n_cells))
           for P in (3, 4)}
    same = np.all(bits(out[3]) == bits(out[4]), axis=(1, 2))
    delta = np.abs(out[3] - out[4]).max(axis=(1, 2))
    wrap = plans[3].chunks_of_block(0)[1][0]  # first cell of the chunk that joins block 0
    first_diff = int(np.argmin(same)) if not same.all() else None
    print(f"positions below {wrap}: {same[:wrap].sum()} of {wrap} bit-identical")
    print(f"positions from {wrap} on: {(~same[wrap:]).sum()} of {n_cells - wrap} differ; first differing position: {first_diff}")
    print(f"largest difference {delta.max():.3g} (outputs are of order 1)")

    fig, ax = plt.subplots(figsize=(9, 3), layout="constrained")
    ax.plot(q_pos, delta, drawstyle="steps-mid", color="tab:red")
    ax.axvline(wrap, color="k", ls="--", lw=1)
    ax.set_yscale("symlog", linthresh=1e-8)
    ax.set_ylim(bottom=0)
    ax.set_xlabel("query position")
    ax.set_ylabel("max |Δ| over heads, dims")
    ax.set_title("P = 3 vs P = 4 over 512 cells")
    plt.show()
    """),
    md("""
    Below the dashed line the two plans agree bit for bit; from it on most positions differ. Why
    exactly there: for a query below 384, chunk 3 is entirely masked. Block 0 of `P = 3` then runs an
    all-masked chunk, which changes nothing (its max stays, `exp(-inf) = 0` adds exact zeros), and the
    empty fourth block of `P = 4` enters the combine with weight `exp(-huge) = 0`, again an exact
    no-op. From 384 on chunk 3 holds real cells and the regrouping is real. This is the shape of the
    bug a user sees: outputs that agree for a while and then stop agreeing at a fixed position.

    ## 3. Measure: the variant policy's P per KV length (H200 profile)

    `ReductionOrder.attention_plan(n_queries, kv_len, n_head, n_head_kv)` asks the policy. The
    variant policy follows llama.cpp: pad the KV length to 256, take the vector kernel for one query
    and choose `P` with llama.cpp's efficiency loop (fill whole waves of `SMs × blocks per SM`).
    The profile supplies the SM count and our kernels' occupancy:
    """),
    code("""
    h200 = get_profile("h200")
    print(f"{h200.name}: {h200.sm_count} SMs, compute capability {h200.compute_capability}, "
          f"blocks per SM {dict(h200.occupancy)}")
    print(h200.source)

    shapes = {"micro (2/1 heads)": (2, 1), "Qwen3-0.6B (16/8)": (16, 8), "Qwen3-8B (32/8)": (32, 8)}
    kv_lens = list(range(256, 8192 + 1, 256))
    fig, ax = plt.subplots(figsize=(9, 3.5), layout="constrained")
    for label, (H, Hkv) in shapes.items():
        ps = [VARIANT.attention_plan(1, n, H, Hkv, device="h200").parallel_blocks for n in kv_lens]
        ax.step(kv_lens, ps, where="post", label=label)
    ax.set_xlabel("KV length (cells)")
    ax.set_ylabel("parallel blocks P")
    ax.set_title("BATCH_VARIANT, one query, h200 profile")
    ax.legend()
    plt.show()
    """),
    code("""
    print(f"{'KV length':>9}  {'queries':>7}  {'kernel':<14} {'P':>3}  {'cells per block':>15}")
    for n in (300, 700, 1500, 3000):
        for nq in (1, 2, 9):
            plan = VARIANT.attention_plan(nq, n, 32, 8, device="h200")
            per_block = plan.split_cells or f"{plan.chunk_cells} x {len(plan.chunks_of_block(0))}"
            print(f"{n:>9}  {nq:>7}  {plan.kernel_name:<14} {plan.parallel_blocks:>3}  {per_block!s:>15}")
    """),
    md("""
    Two things move the grouping under the variant policy. Along the KV axis, `P` grows with the chunk
    count until the waves are full, then stays; every step changes which chunks share a block. Along
    the batch axis, more than one query leaves the vector kernel for a tile kernel (hiraishin's
    stand-in for llama.cpp's multi-query kernels) with contiguous splits, its own split size and its
    own order inside a block — so a verify batch of 2 or 9 tokens is summed nothing like a
    single-token decode, at any KV length.

    ## 4. Why the invariant policy stops verify batches at multiples of 256 cells

    `BATCH_INVARIANT` always launches the one-query vector kernel and sizes `P` from the count of ONE
    query, so the batch width cannot change the plan. One input is left: the attended range. A verify
    batch covering positions `p .. p+n-1` attends `p+n` cells padded to 256, while the same position
    decoded alone attended `p+1` cells padded to 256. If the batch straddles a multiple of 256, its
    early queries are planned with more chunks than when they were decoded alone — and more chunks can
    mean another `P`. Whether that changes a query's bits depends on how the chunks it can see are
    grouped into blocks:
    """),
    code("""
    def visible_grouping(plan, pos):
        \"\"\"The chunks a query at ``pos`` can see, grouped by block, in block order (empty blocks dropped).\"\"\"
        groups = [[a for a, _ in plan.chunks_of_block(y) if a <= pos] for y in range(plan.parallel_blocks)]
        return [g for g in groups if g]


    H, Hkv = 2, 1  # the micro model's heads
    print(f"{'boundary':>8}  {'P below':>7}  {'P above':>7}  early queries regrouped?")
    hits = []
    for boundary in range(256, 4096 + 1, 256):
        below = INVARIANT.attention_plan(1, boundary, H, Hkv, device="h200")  # decoded alone, just below
        above = INVARIANT.attention_plan(1, boundary + 1, H, Hkv, device="h200")  # a batch that crossed it
        regrouped = any(visible_grouping(below, p) != visible_grouping(above, p)
                        for p in range(boundary - 8, boundary))
        if regrouped:
            hits.append(boundary)
        print(f"{boundary:>8}  {below.parallel_blocks:>7}  {above.parallel_blocks:>7}  {'yes' if regrouped else 'no'}")
    print("boundaries where a straddling batch would change bits:", hits)
    """),
    md("""
    While `P` equals the chunk count, each chunk has a block of its own, the extra masked chunks of a
    larger range fall into blocks of their own, and those add exact zeros (section 2). Where the
    efficiency loop's `P` falls behind the chunk count and then jumps, the chunks a query sees are
    regrouped. Take the first such boundary and run a batch of 16 positions around it three ways:
    each position alone (what plain decoding does), one batch straddling the boundary, and the same
    positions cut at the boundary as `order.verify_limit` does:
    """),
    code("""
    B = hits[0] if hits else 1280
    n_ctx = B + 16
    q, k, v = make_cache(seed=7, n_ctx=n_ctx)
    positions = np.arange(B - 8, B + 8)


    def attend(pos_batch, order):
        \"\"\"One launch for consecutive positions; kv_len = last position + 1, plan from ``order``.\"\"\"
        pos_batch = np.asarray(pos_batch)
        plan = order.attention_plan(len(pos_batch), int(pos_batch[-1]) + 1, H, Hkv, device="h200")
        return run_plan(q[pos_batch], k, v, pos_batch, plan)


    alone = np.concatenate([attend([p], INVARIANT) for p in positions])
    straddling = attend(positions, INVARIANT)
    n_first = INVARIANT.verify_limit(int(positions[0]), len(positions))
    guarded = np.concatenate([attend(positions[:n_first], INVARIANT), attend(positions[n_first:], INVARIANT)])
    print(f"verify_limit({positions[0]}, {len(positions)}) = {n_first}: the guard cuts the batch at cell {positions[0] + n_first}")
    for name, got in (("one straddling batch", straddling), ("batch cut at the boundary", guarded)):
        same = np.all(bits(got) == bits(alone), axis=(1, 2))
        print(f"{name:<26} positions bit-identical to decoding alone: {same.sum()}/{len(positions)}"
              f"  (below {B}: {same[positions < B].sum()}/{(positions < B).sum()})")

    fixed = ReductionOrder.FIXED_SPLIT  # blocks at fixed cell positions: P never depends on the range
    alone_f = np.concatenate([attend([p], fixed) for p in positions])
    print("FIXED_SPLIT, one straddling batch == alone, bit for bit:",
          np.array_equal(bits(attend(positions, fixed)), bits(alone_f)))
    """),
    md("""
    The straddling batch reproduces plain decoding only for the positions past the boundary (they
    attend the same padded range either way); its early positions come out with the other `P`. Cut at
    the boundary, every position matches. That is all the guard does: `ReductionOrder.verify_limit`
    ends a verify pass at the next multiple of `kv_boundary` (256), so no pass mixes queries from two
    padded ranges. Speculative decoding pays for it with an occasional shorter verify batch.

    `FIXED_SPLIT` is the other way out (SGLang's deterministic mode, Thinking Machines' kernels):
    split at fixed cell positions, so a larger range only adds blocks past the end, which a query never
    sees — no guard needed, at the price of a `P` that does not adapt to the GPU.

    **Next:** notebook 03 runs a whole Qwen3 forward pass with these kernels and replays decoding in
    batches.
    """),
]


# ------------------------------------------------------------------------------------------------
# 03: replay and speculative decoding

NB03 = [
    md("""
    # 03 · Replay and speculative decoding

    Notebooks 01 and 02 showed single kernels whose bits depend on the batch. Here the whole Qwen3
    forward pass runs on them, on a small synthetic model, and we ask what reaches the tokens:

    1. plain greedy decoding (one token per pass);
    2. **replay**: feed the same sequence again in passes of 2, 3, 5, 9 and 16 tokens and compare every
       logit with the one-token passes, under `BATCH_VARIANT` and `BATCH_INVARIANT`;
    3. the **localizer**: the first op of the forward pass whose output differs;
    4. **speculative decoding** with the model as its own draft and with a noisy draft: exact under
       `BATCH_INVARIANT`; under `BATCH_VARIANT`, rejected guesses and tokens that leave plain decoding.

    The model is written into a temporary directory by `hiraishin.model.synth.write_synthetic`:
    the Qwen3 layout and Q4_K_M type mix of a real file, seeded Gaussian weights, a 4,096-token slice
    of the real Qwen3 vocabulary. Its text is gibberish; its arithmetic is the real thing.
    """),
    code("""
    import tempfile
    from pathlib import Path

    import matplotlib.pyplot as plt
    import numpy as np

    from hiraishin import Qwen3, ReductionOrder
    from hiraishin.decode.draft import write_draft
    from hiraishin.model.synth import write_synthetic

    VARIANT, INVARIANT = ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT
    PROMPT = "Speculative decoding promises"
    N_NEW = 40  # new tokens per run
    BATCH_SIZES = [2, 3, 5, 9, 16]

    workdir = Path(tempfile.mkdtemp(prefix="hiraishin-nb03-"))
    target_path = write_synthetic(workdir / "qwen3-micro.gguf", shape="micro", seed=0, progress=False)
    # a draft: the target's weights plus seeded noise (5% of each tensor's std), requantized
    draft_path = write_draft(target_path, workdir / "qwen3-micro-draft.gguf", noise=0.05, seed=1)

    load = lambda path: Qwen3.from_gguf(path, device="auto", n_ctx=256, progress=False)  # noqa: E731
    target = load(target_path)
    print(target)
    c = target.config
    print(f"{c.n_layer} layers, n_embd {c.n_embd}, n_ff {c.n_ff}, heads {c.n_head}/{c.n_head_kv}, vocab {c.n_vocab}")
    """),
    md("""
    ## 1. Plain greedy decoding

    One token per pass, argmax every time. This is the reference every other run is compared with.
    """),
    code("""
    ids = target.tokenizer.encode(PROMPT)
    plain = target.generate(ids, max_new_tokens=N_NEW, order=INVARIANT, stop_at_eos=False)
    print(f"prompt {PROMPT!r} -> {len(ids)} tokens")
    print(f"{len(plain.tokens)} new tokens: {plain.tokens}")
    print("text:", repr(plain.text[:160]))
    """),
    md("""
    ## 2. Replay: the same sequence in batches

    `model.replay(tokens, batch_sizes, order)` decodes the sequence one token per pass, then rolls the
    KV cache back and feeds it again in passes of `b` tokens — what a speculative verifier does — and
    compares every logit of every position, bit for bit.
    """),
    code("""
    sequence = ids + plain.tokens
    reports = {order.name: target.replay(sequence, BATCH_SIZES, order=order) for order in (VARIANT, INVARIANT)}
    for report in reports.values():
        print(report, "\\n")
    # One token per pass, both orders pick the same geometry (one column, one query), so the variant
    # replay's one-token passes must choose exactly the tokens plain decoding chose:
    chosen = reports[VARIANT.name].plain_argmax[len(ids) - 1:len(ids) - 1 + len(plain.tokens)]
    print("BATCH_VARIANT one-token passes pick plain decoding's tokens:", chosen == plain.tokens)
    """),
    code("""
    fig, axes = plt.subplots(1, 2, figsize=(12, 3.8), layout="constrained", sharey=True)
    for ax, report in zip(axes, reports.values()):
        report.plot(ax=ax, title=f"{report.order}: max |Δlogit| vs one-token passes")
    plt.show()
    print(reports[VARIANT.name].histogram_table())
    """),
    md("""
    Under `BATCH_INVARIANT` the table ends with "every logit is bit-identical", for every batch size
    and position. Under `BATCH_VARIANT`, look at which batch sizes differ. Batches wider than 8 leave
    the mat-vec kernel for the tiled mat-mat kernel (a different order everywhere), so they differ
    almost everywhere. Batches of 2 to 5 stay on the mat-vec kernel, and whether they differ depends on
    the row lengths — notebook 01, section 4 — and on a filter described below. This micro model's
    rows are short:
    """),
    code("""
    for il, layer in enumerate(target.weights.layers):
        for name in ("attn_q", "attn_output", "ffn_gate", "ffn_down"):
            wt = getattr(layer, name)
            k_cols = wt.shape[0]  # ggml shape: (K columns, N rows)
            print(f"blk.{il}.{name:<12} {wt.qtype}  K = {k_cols:>4}  ({k_cols // 256} super-block(s) per row)")
    print(f"output (tied)      {target.weights.output.qtype}  K = {target.weights.output.shape[0]:>4}")
    """),
    md("""
    If the difference of a batch size is zero in the table although its plan differs, compare these
    row lengths with the threshold notebook 01 printed. A real Qwen3 has rows of thousands of values,
    and there every batch width that changes the warp count changes the logits.

    Where the differences are not zero, compare them with the plain run's top-2 gaps: a token flips
    only where the gap between the best and second-best logit is smaller than the shift.
    """),
    code("""
    rep_v = reports[VARIANT.name]
    gaps = np.asarray(rep_v.plain_gap)
    worst = max(rep_v.batches, key=lambda b: b.max_abs_diff)
    shift = np.asarray(worst.diff_by_position)
    print(f"batch {worst.batch_size}: max shift {shift.max():.3g}; plain top-2 gaps: min {gaps.min():.3g}, "
          f"median {np.median(gaps):.3g}")
    print(f"positions where the shift exceeds the gap: {int((shift > gaps).sum())}, "
          f"argmax flips found: {len(worst.flips)}")

    fig, ax = plt.subplots(figsize=(9, 3), layout="constrained")
    x = np.asarray(rep_v.positions)
    ax.plot(x, gaps, "o-", ms=3, label="plain top-2 gap")
    ax.plot(x, shift, "s-", ms=3, label=f"max |Δlogit|, batch {worst.batch_size}")
    for f in worst.flips:
        ax.axvline(f.position, color="tab:red", alpha=0.4)
    ax.set_yscale("log")
    ax.set_xlabel("position")
    ax.legend()
    ax.set_title("a flip needs a shift larger than the gap (red lines: flips)")
    plt.show()
    """),
    md("""
    ## 3. The localizer: which op differs first

    `report.localize(model)` reruns the earliest differing position twice, once alone and once inside
    its batched pass, records every intermediate tensor (`record=` hook of `Qwen3.forward`), and names
    the first one whose row differs in any bit.
    """),
    code("""
    loc = rep_v.localize(target)
    print(loc)
    if loc is not None:
        names = [name for name, _ in loc.ops]
        deltas = np.array([d for _, d in loc.ops])
        fig, ax = plt.subplots(figsize=(12, 3.2), layout="constrained")
        ax.bar(range(len(names)), deltas, color=["tab:red" if d > 0 else "tab:gray" for d in deltas])
        ax.set_xticks(range(len(names)), names, rotation=90, fontsize=7)
        ax.set_yscale("symlog", linthresh=1e-9)
        ax.set_ylabel("max |Δ| at the position")
        ax.set_title(f"position {loc.position}: alone vs in a pass of {loc.pass_size} (first differing: {loc.name})")
        plt.show()
    """),
    md("""
    The first red bar is where the batch first changed an order of adds; everything after it inherits
    the difference — or, sometimes, does not. Look for gray bars after red ones.

    ### Differences that never reach the logits

    Every mat-vec quantizes its input to q8_1 (int8 values, one scale per 32) before the dot products.
    An input that moved by an ulp almost always rounds to the same int8, so the mat-vec's output is
    bit-identical again. Record one pass of three tokens and three one-token passes under
    `BATCH_VARIANT` and count, per op, the elements that differ:
    """),
    code("""
    def bits(a):
        return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


    def recorded(tokens, order):
        \"\"\"Per op: (last token's row from one-token passes, its row from one pass over all tokens).\"\"\"
        target.reset()
        for pos, t in enumerate(tokens[:-1]):
            target.forward([t], pos, order=order)
        alone = {}
        target.forward(tokens[-1:], len(tokens) - 1, order=order, record=alone)
        target.reset()
        batched = {}
        target.forward(tokens, 0, order=order, record=batched)
        return {name: (alone[name][0], batched[name][-1]) for name in alone}


    rows = recorded(sequence[:3], VARIANT)
    print(f"{'op':<22} elements that differ (3rd token: in a pass of 3 vs alone)")
    for name, (a, b) in rows.items():
        print(f"{name:<22} {int((bits(a) != bits(b)).sum()):>5} / {a.size}")
    """),
    md("""
    Rows that differ followed by rows that are identical again are the q8_1 filter at work. It hides
    most of the variance of short rows and small batches — until one value lands near a rounding
    boundary of the int8 grid, and then the difference passes through at the size of one int8 step. That is
    why batch variance shows up in real models as rare, position-dependent jumps rather than as a
    uniform haze.

    ## 4. Speculative decoding

    `model.generate_speculative(prompt, draft, n_draft, order)`: each cycle the draft guesses up to
    `n_draft` tokens one pass at a time; the target verifies all of them in ONE pass; a guess survives
    only if it equals the target's own argmax there. The emitted tokens are always the target's argmaxes
    — so they equal plain decoding exactly when the target's logits do not depend on the pass width.

    Two drafts: the target itself (a second instance with its own KV cache: when the verifier's
    logits equal the draft's one-token logits, every guess is the target's own argmax and must be
    accepted) and the noisy draft written above. `p_min_gap=0` switches off the draft's confidence cut,
    so it always guesses `n_draft` tokens.
    """),
    code("""
    drafts = {"self": load(target_path), "noisy": load(draft_path)}
    runs = {}
    for order in (INVARIANT, VARIANT):
        for draft_name, draft in drafts.items():
            runs[order.name, draft_name] = target.generate_speculative(
                ids, draft, n_draft=8, order=order, max_new_tokens=N_NEW, p_min_gap=0.0,
                stop_at_eos=False, plain_tokens=plain.tokens)

    print(f"{'order':<16} {'draft':<6} {'acceptance':>10} {'verify batch':>12} {'= plain?':>9} {'first divergence':>17}")
    for (order_name, draft_name), r in runs.items():
        print(f"{order_name:<16} {draft_name:<6} {r.acceptance_rate:>10.1%} {r.mean_verify_batch:>12.2f} "
              f"{str(r.matches_plain):>9} {str(r.first_divergence):>17}")
    for draft_name in drafts:
        assert runs[INVARIANT.name, draft_name].tokens == plain.tokens  # the guarantee
    """),
    code("""
    fig, axes = plt.subplots(1, 2, figsize=(11, 3.2), layout="constrained")
    for ax, order in zip(axes, (INVARIANT, VARIANT)):
        for draft_name, marker in (("self", "o"), ("noisy", "s")):
            r = runs[order.name, draft_name]
            ax.plot([cy.accepted / cy.drafted if cy.drafted else 1.0 for cy in r.cycles], marker + "-", ms=4,
                    label=f"{draft_name} draft ({r.acceptance_rate:.0%})")
        ax.set_ylim(-0.05, 1.05)
        ax.set_xlabel("cycle")
        ax.set_ylabel("accepted / drafted")
        ax.set_title(order.name)
        ax.legend(fontsize="small")
    plt.show()
    r_v = runs[VARIANT.name, "self"]
    if r_v.first_divergence is not None:
        i = r_v.first_divergence
        print(f"BATCH_VARIANT, self draft: generated token {i} is {r_v.tokens[i]} (plain decoding: "
              f"{plain.tokens[i]}); from there on the two texts are different continuations")
    else:
        print("BATCH_VARIANT, self draft: no divergence in this run (no shift exceeded a top-2 gap)")
    """),
    md("""
    Under `BATCH_INVARIANT` both drafts reproduce plain decoding exactly (the cell asserts it), and the
    self draft is accepted every time: its one-token logits and the verifier's batched logits are the
    same bits. Rejections of the noisy draft cost speed, never correctness.

    Under `BATCH_VARIANT` read the self-draft row first. Any acceptance below 100% there means the
    *same weights* disagreed with themselves, because the verifier's wide passes sum in another order
    than the draft's one-token passes: every such rejection is the bug. Wherever a batched argmax
    differs from the one-token argmax, the output leaves plain greedy decoding for good (the first
    divergence column, and in the plot the cycle where the self draft's acceptance drops). With a
    real model on a GPU the same thing happens on longer texts — see `hiraishin demo` and `bench/`.
    """),
    code("""
    import shutil

    shutil.rmtree(workdir, ignore_errors=True)  # the temporary model files (the loaded models keep their maps)
    """),
]


NOTEBOOKS = {
    "01_float_addition_is_not_associative.ipynb": NB01,
    "02_split_kv_attention_and_position_384.ipynb": NB02,
    "03_replay_and_speculative_decoding.ipynb": NB03,
}


def build(name: str, cells) -> nbformat.NotebookNode:
    """A notebook with deterministic cell ids and no outputs."""
    nb = nbformat.v4.new_notebook()
    nb.metadata = {"kernelspec": dict(KERNELSPEC), "language_info": {"name": "python"}}
    stem = name.split("_")[0]
    for i, (kind, source) in enumerate(cells):
        cell = nbformat.v4.new_markdown_cell(source) if kind == "markdown" else nbformat.v4.new_code_cell(source)
        cell.id = f"nb{stem}-{i:02d}"
        nb.cells.append(cell)
    nbformat.validate(nb)
    return nb


def render(name: str) -> str:
    return nbformat.writes(build(name, NOTEBOOKS[name])) + "\n"


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    check = "--check" in argv
    stale = []
    for name in NOTEBOOKS:
        path = HERE / name
        text = render(name)
        if check:
            if not path.exists() or path.read_text() != text:
                stale.append(name)
        else:
            path.write_text(text)
            print(f"wrote {path}")
    if stale:
        print("out of date (run python notebooks/make_notebooks.py):", ", ".join(stale))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
