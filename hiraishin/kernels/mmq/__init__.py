"""The sub-block order: a mat-vec / mat-mat of Q4_K and Q6_K weights whose float operations are
defined per q8_1 block of 32 values, on int8 tensor cores, identical at every width.

Order, for one output (row r, column j) of an (N, K) weight (``hiraishin/plans/subblock.py``)::

    NB = K/256; NSEG = min(NB, 16)                         # from K alone
    segment s = super-blocks [s*NB // NSEG, (s+1)*NB // NSEG)
    seg[s] = 0.0f
    for each q8_1 block b of segment s in k order (super-block i = b // 8, sub-block jj = b % 8):
        dx, sx = fp16 d and s of activation block b (llama.cpp q8_1 layout)
        Q4_K:  C  = sum_{l<32} q_l * qx_l                   (q = 4-bit value of sub-block jj; exact int)
               ws = d_i * sc_jj ; wm = dmin_i * m_jj       (__fmul_rn; exact: 11 x 6 bits)
               seg[s] = __fmaf_rn(__fmul_rn(ws, dx), (float)C, seg[s])
               seg[s] = __fmaf_rn(-wm, sx, seg[s])
        Q6_K:  C  = sc[2jj] * sum_{l<16} (q_l-32) qx_l + sc[2jj+1] * sum_{16<=l<32} (q_l-32) qx_l
                                                            (exact int: |C| <= 2*128*16*32*127 < 2^24)
               seg[s] = __fmaf_rn(__fmul_rn(d_i, dx), (float)C, seg[s])
    out = seg[0]; for s = 1 .. NSEG-1: out = __fadd_rn(out, seg[s])

Geometry (``mmq.cu``): a CUDA block is a tile of 16 rows (the M of ``mma.m16n8k32``) x 8 or 16
columns (one or two n-tiles of 8; wider widths: more CUDA blocks along y; or, ``plan.interleave``, 9..16
columns as two one-tile CUDA blocks of a row tile side by side along x; or, ``plan.warp_split``, 16
columns per CUDA block with each warp one n-tile of them, two warps per K-segment), ``plan.nwarps`` warps
(warp w sums segments w, w + nwarps, ...; a launch fact), a shared-memory hand-over of
NSEG x 16 x columns floats, one barrier, the segment sum in order. Q4_K: one
``mma.sync.aligned.m16n8k32.row.col.s32.s8.s8.s32`` per 32-value sub-block (nibbles masked to
int8); Q6_K: two ``m16n8k16`` per q8_1 block, one per 16-value sub-block, with ``q - 32`` formed
bytewise, the two integer results scaled by their int8 scales and added as integers. One column
(``HX_ONECOL``): the same kernel, float work only for the column that exists. Launch facts that
change no bit: warps, register cap, activation prefetch (tuned per shape for launches of 2..8
columns: ``plans/subblock.py`` ``SUBBLOCK_FEW_COLS_TUNING``; of 9..16 columns, with the columns per
CUDA block and the warp split: ``SUBBLOCK_WIDE_COLS_TUNING``, empty (the side-by-side blocks won
isolated and lost in whole passes on the H200; the warp split lost 30% in whole passes); both replaced by
``HIRAISHIN_MMQ_TUNING``),
the activation layout (``HX_XLAYOUT``: the MMA layouts of ``quantize/layout.py``, where a lane's
B fragments of two q8_1 blocks are one 16-byte load and the fp16 scales of four another, and Q4_K
rows are read 8 bytes per pair of k slots; ``HIRAISHIN_MMQ_XLAYOUT=0``: llama.cpp's 36-byte blocks,
read 4 bytes at a time, which kept L1 the bound of these launches on the H200; ``=2``: for Q4_K the MMA8
layouts, the records of each n-tile's 8 columns interleaved so that a load whose lanes read 8 columns reads
512 contiguous bytes, the default for launches of 6+ columns (``MMA8_MIN_COLS``; 1.5-10% faster 6-16-token
passes of the 8B on the H200; ``HIRAISHIN_MMQ_XLAYOUT=1``: the MMA layouts at every width), and four
measured-slower alternatives kept as opt-in switches: ``HX_LIVE`` (the integer C moved across the
warp so all lanes share the float work of <= 4 live columns; ``HIRAISHIN_MMQ_LIVE=1``),
``HX_PREFETCH_NEXT`` (an L2 hint for the next super-block; ``HIRAISHIN_MMQ_PREFETCH_NEXT=1``) and
``HX_PIPELINE_W`` (Q4_K: the next super-block's loads issued into registers before the current one's
MMAs, the first before the PDL wait; ``HIRAISHIN_MMQ_PIPELINE_W=1``) and ``HX_STAGE_W`` (Q4_K: the next super-block copied into shared
memory with cp.async, the first copy before the PDL wait; ``HIRAISHIN_MMQ_STAGE_W=1``: faster on the
0.6B's short rows, slower on the 8B's; ``=wide``, only the 9..16-column launches: 0.6-3% faster, same
bits, a candidate default); and ``HX_MT`` (two 16-row tiles per warp, each super-block's activations serving
32 rows; ``HIRAISHIN_MMQ_MTILES=c`` for launches of c+ columns: 222 registers, 12-16% slower 9-16-token passes).

Upstream facts mirrored (llama.cpp ggml-cuda ``mmq.cuh`` / ``mma.cuh``; reference section 4): MMQ
accumulates per 32-value sub-block in k order, ``sum += dA*dB*C_int32`` then the Q4_K min term
``sum += mA*sB`` with the q8_1 ``s`` field, and Q6_K's 16-value sub-blocks via their int8 scales.
Unlike upstream the scale products are float32 (upstream packs ``half2(d*sc, -dmin*m)`` in FP16),
the k split is fixed by K (upstream's stream-k split depends on SM count and rows), and every
rounding is an explicit IEEE intrinsic: this is our own exact order, not llama.cpp's bits.

API: ``plan = hiraishin.plans.subblock.subblock_plan(ncols, qtype, k, n=rows)``;
``emulate(w, qtype, xq, plan)`` (CPU; ``xq`` = ``quantize.emulate(x)`` bytes, or float32 ``x``);
``launch(w, qtype, xq, plan, out)`` (cupy; ``xq`` = ``quantize.launch(x, xq)`` bytes, llama.cpp's
q8_1 layout, (ncols, K/32*36) uint8, converted to the kernel's ``launch.activation_layout(plan)``; a
forward pass quantizes straight into it; ``out`` float32 (ncols, N)). Measured on an H200:
``bench/results/2026-12-01-h200-mmq/README.md``, ``bench/results/2026-12-03-h200-session9/README.md``,
``bench/results/2026-12-03-h200-session10/README.md``, ``bench/results/2026-12-03-h200-session11/README.md``.

Files: ``mma_rows.cu`` (mma.sync helpers and weight-row loads, shared with ``kernels/mmq_stock``),
``mmq.cu`` (``hx_mmq``, and ``hx_mmq_multi``: up to three weights of one plan in one launch, the same
tiles), ``onecol_dp4a.cu`` (one column on dp4a, a warp per row: the same order for rows of a multiple of 16
super-blocks, ``HIRAISHIN_SUBBLOCK_DP4A``; several rows a warp for rows of 1, 2, 4 or 8,
``HIRAISHIN_SUBBLOCK_DP4A_SHORT``; up to four columns of rows of 16, ``HIRAISHIN_SUBBLOCK_DP4A_COLS``;
``plans/subblock.py``; the CUDA block's activations copied to shared memory, ``HIRAISHIN_DP4A_XSTAGE``, and its
weight rows, ``HIRAISHIN_DP4A_WSTAGE``, both on), :mod:`.launch` (``launch``; ``MMQMultiLaunch``, used by the backend
unless ``HIRAISHIN_MMQ_MULTI=0``), :mod:`.wtile` (Q4_K and Q6_K weights in 16-row tile records, which every kernel
here reads under ``HX_WTILE``: a warp's weight loads then read contiguous bytes; a model's SUBBLOCK passes read them,
``Qwen3.use_weight_layout_for``; Q6_K only under ``HIRAISHIN_MMQ_WTILE_Q6K=1``, untimed), :mod:`.emulate` (``emulate``).
"""

from .emulate import emulate
from .launch import launch

__all__ = ["emulate", "launch"]
