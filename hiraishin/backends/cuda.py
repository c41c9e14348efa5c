"""The CUDA backend: CuPy arrays, every op a hand-written RawKernel (``hiraishin/kernels/<op>/``).

A one-token decode step is a few hundred small launches, so the host time per launch is a speed
limit. The checked ops (the :class:`~hiraishin.backends.base.Backend` methods) validate once and
call :class:`CudaOps`, which launches with cached kernel handles, cached plans and prepared
mat-vec launches, writing into given buffers. Every launch is the one the kernel's own checked
tests make (same kernel, geometry and arguments), so the results are the same bits.

Scratch buffers (q8_1 activations, attention partials) of passes of at most
:data:`SCRATCH_MAX_TOKENS` tokens are kept and reused: launches run in order on one stream, so a
buffer is never rewritten before the kernels reading it have run (use one stream per backend;
CUDA-graph replays run on the model's own stream, in the same order).
"""

from __future__ import annotations

import weakref

import numpy as np

from ..errors import BackendError, HiraishinError
from ..kernels import elementwise, l2ahead, rmsnorm, rope, tiled
from ..kernels.attention.launch import current_profile
from ..kernels.compile import cupy_available, require_cupy
from ..kernels.fused import launch as fused_launch
from ..kernels.fused.launch import (
    launch_add_rms_norm_q8_1,
    launch_embed_rms_norm_q8_1,
    launch_rms_norm_q8_1,
    launch_swiglu_q8_1,
)
from ..kernels.mmq.launch import launch as mmq_launch
from ..kernels.mmq.launch import MMQMultiLaunch
from ..kernels.mmq.launch import multi_enabled as mmq_multi_enabled
from ..kernels.mmq.launch import xlayout_setting as mmq_xlayout
from ..kernels.mmq.wtile import tile_weight, tiles_weight, untile_weight
from ..kernels.mmq_stock.launch import launch as mmq_stock_launch
from ..kernels.mmvq.launch import MULTI_MAX_WEIGHTS, MixedMatVecLaunch, MultiMatVecLaunch, prepared_plan
from ..kernels.mmvq_swiglu.launch import swiglu_epilogue_enabled
from ..kernels.norm_mmvq.launch import NormArgmaxLaunch
from ..kernels.quantize.launch import QuantizeLaunch
from ..kernels.quantize.launch import output_shape as quantize_output_shape
from ..kernels.quantize.layout import LAYOUT_COLUMN_GROUP, as_layout, layout_for
from ..kernels.swiglu_down.launch import swiglu_down_tokens
from ..plans import MMQStockPlan, SubBlockPlan
from ..plans.matvec import matvec_traits
from .base import Backend, feed_forward_steps
from .checks import get_rows_width
from .cuda_attention import CudaAttentionOps
from .cuda_fused import CudaFusedOps
from .cuda_matvec import PreparedMatVec, mixed_groups

__all__ = ["CudaBackend", "CudaOps", "cuda_available", "SCRATCH_MAX_TOKENS"]

# Passes up to this many tokens (decode steps, speculative verify batches of up to 16) reuse
# scratch buffers; wider ones (prompt prefill) allocate per call, so the memory held stays small.
SCRATCH_MAX_TOKENS = 16

# Alignment the mat-vec kernels need of a weight's start: Q4_K loads 4-byte ints, Q6_K and
# Q8_0 16-bit halves where their blocks allow no more (mmvq.cu checks wider alignment itself).
WEIGHT_ALIGNMENT = {"Q4_K": 4, "Q6_K": 2, "Q8_0": 2}

_F32 = np.dtype(np.float32)
_U8 = np.dtype(np.uint8)


def cuda_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    return cupy_available()


class CudaOps(CudaAttentionOps, CudaFusedOps):
    """The CUDA backend's ops with no input checks (see the module docstring).

    Callers promise: CuPy arrays, C-contiguous, of the dtypes and shapes the op documents on
    :class:`~hiraishin.backends.base.Backend`; ``out`` (when given) of the result's shape,
    float32, C-contiguous and overlapping no input; device positions within the RoPE table and
    below ``kv_len``. A broken promise is undefined behaviour on the GPU, not an error.
    """

    # bound on the prepared mat-vec cache (a few dozen entries per order in practice)
    _CACHE_MAX = 8192

    def __init__(self, backend: "CudaBackend"):
        self.backend = backend
        self.xp = backend.xp
        self._empty = backend.xp.empty
        self._matvecs: dict = {}
        self._multis: dict = {}
        self._norm_multis: dict = {}  # norm_matvecs' fused launches (or None: not fused), by weights and limits
        self._quantize: dict = {}
        # each token-picking launch's own scratch: (T, n) -> hx_argmax_rows' (partials, counters);
        # ("topk", n, k) -> TopKRow; ("head_argmax", ...) -> ArgmaxMatVecLaunch; and the other launches with
        # counters of their own: ("swiglu", ...) -> SwigluMatVecLaunch
        self._token_scratch: dict = {}
        self._scratch: dict = {}
        self._ahead = None  # (side stream, fork event, join event) of l2_ahead, made on first use
        self._ahead_open = False  # launched on the side stream since the last join

    def l2_ahead(self, spans, bulk: bool = True) -> None:
        """Ask L2 for ``spans`` (``(array, limit)``, ``hiraishin/kernels/l2ahead``) from a stream
        beside the current one, once the work enqueued so far has run; nothing waits for it until
        :meth:`l2_ahead_join`. Cache hints only: no result changes."""
        if not spans:
            return
        import cupy

        if self._ahead is None:
            self._ahead = (cupy.cuda.Stream(non_blocking=True), cupy.cuda.Event(disable_timing=True),
                           cupy.cuda.Event(disable_timing=True))
        side, fork, _ = self._ahead
        fork.record(cupy.cuda.get_current_stream())
        side.wait_event(fork)
        l2ahead.launch(spans, side, bulk)
        self._ahead_open = True

    def l2_ahead_join(self) -> None:
        """Make the current stream wait for the side stream's prefetches (a captured pass must end
        joined; in eager passes it keeps the side stream from running past the pass)."""
        if self._ahead_open:
            import cupy

            side, _, join = self._ahead
            join.record(side)
            cupy.cuda.get_current_stream().wait_event(join)
            self._ahead_open = False

    def scratch(self, name: str, shape: tuple, dtype=_F32, zeroed: bool = False):
        """A buffer reused across calls for small passes (see the module docstring), else a new one;
        ``zeroed``: filled with zeros when it is made (what no writer of it ever writes stays 0)."""
        make = self.xp.zeros if zeroed else self._empty
        if shape[0] > SCRATCH_MAX_TOKENS:
            return make(shape, dtype)
        key = (name, shape, dtype)
        buf = self._scratch.get(key)
        if buf is None:
            buf = self._scratch[key] = make(shape, dtype)
        return buf

    def positions(self, start_pos: int, n: int):
        return self.xp.arange(start_pos, start_pos + n, dtype=np.int32)

    def get_rows(self, table, qtype: str, ids, out=None):
        K = get_rows_width(table.shape, qtype)
        return elementwise.launch_get_rows(table, qtype, ids,
                                           self._empty((ids.size, K), _F32) if out is None else out)

    def rms_norm(self, x, w, eps: float, out=None):
        return rmsnorm.launch(x, w, eps, self._empty(x.shape, _F32) if out is None else out)

    def rope(self, x, pos, cos_table, sin_table, out=None):
        return rope.launch(x, pos, cos_table, sin_table, self._empty(x.shape, _F32) if out is None else out)

    def swiglu(self, g, u, out=None):
        return elementwise.launch_swiglu(g, u, self._empty(g.shape, _F32) if out is None else out)

    def add(self, a, b, out=None):
        return elementwise.launch_add(a, b, self._empty(a.shape, _F32) if out is None else out)

    def argmax_rows(self, x, out=None, advance=None, pos=None):
        """Each row's argmax; ``advance`` = (int32 (2,) inputs of the next one-token pass, int32 log by
        position or None) with ``pos`` the pass's positions: see ``launch_argmax_rows``."""
        T, n = x.shape
        state = self._token_scratch.get((T, n))
        if state is None:  # made by a pass's eager warm-up, before any capture of it
            state = self._token_scratch[(T, n)] = elementwise.argmax_scratch(self.xp, T, n)
        out = self._empty((T,), np.int32) if out is None else out
        if advance is None:
            return elementwise.launch_argmax_rows(x, out, *state)
        return elementwise.launch_argmax_rows(x, out, *state, pos=pos, advance=advance[0], log=advance[1])

    def topk_row(self, x_row, k: int, out):
        """The ``k`` largest values of the float32 (n,) row ``x_row`` into int32 (k, 2) ``out`` (index, value bits;
        ``hiraishin.decode.greedy.top_k_of``'s rule; :class:`~hiraishin.kernels.elementwise.launch.TopKRow`)."""
        key = ("topk", x_row.size, k)
        hit = self._token_scratch.get(key)
        if hit is None:
            hit = self._token_scratch[key] = elementwise.launch.TopKRow(self.xp, x_row.size, k)
        return hit(x_row, out)

    def matvec(self, order, ncols: int, qtype: str, w) -> PreparedMatVec:
        """The prepared mat-vec for ``ncols`` columns times weight ``w`` under ``order`` (cached)."""
        n, row_bytes = w.shape
        tiles = bool(self.backend.tiled) and w.data.ptr in self.backend.tiled  # (relayout_weight)
        key = (order, ncols, qtype, n, row_bytes, mmq_multi_enabled(), mmq_xlayout(), tiles)
        hit = self._matvecs.get(key)
        if hit is None:
            if len(self._matvecs) >= self._CACHE_MAX:
                self._matvecs.clear()
            t = matvec_traits(qtype)
            plan = self.backend.matvec_plan(order, ncols, qtype, row_bytes // t.block_bytes * t.qk, n)
            wtile = tiles and isinstance(plan, SubBlockPlan)
            hit = self._matvecs[key] = PreparedMatVec(plan, qtype, n, row_bytes, wtile)
        if tiles and not isinstance(hit.plan, SubBlockPlan):
            raise HiraishinError(
                f"this {qtype} weight ({n} rows) is laid out as 16-row tiles, which only the sub-block kernels read; "
                f"{order.name} at {ncols} columns plans {type(hit.plan).__name__}: call "
                f"model.set_weight_layout('rows') (or model.use_weight_layout_for(order)) before its passes")
        return hit

    def quantize(self, x, layout: str | None = None, out=None):
        """q8_1 bytes of float32 ``x`` (T, K) in ``layout`` (None: llama.cpp's), written into ``out``
        or a scratch buffer."""
        T, K = x.shape
        q = self._quantize.get((T, K, layout))
        if q is None:
            q = self._quantize[(T, K, layout)] = QuantizeLaunch(T, K, layout)
        if out is None:
            out = self._q8_1_scratch(T, K, layout)
        return q(x, out) if T else out

    def mul_mat_q8_1(self, w, qtype: str, xq, plan):
        """A mat-vec of q8_1 activations in llama.cpp's layout with an explicit plan."""
        t = matvec_traits(qtype)
        out = self._empty((plan.ncols, w.shape[0]), _F32)
        if isinstance(plan, SubBlockPlan):
            return mmq_launch(w, qtype, xq, plan, out)
        if isinstance(plan, MMQStockPlan):
            return mmq_stock_launch(w, qtype, xq, plan, out)
        if plan.kernel == "tiled":
            return tiled.launch(w, qtype, xq, plan, out)
        y = as_layout(xq, layout_for(qtype))  # the kernel reads its own layout
        return prepared_plan(qtype, w.shape[0], w.shape[1] // t.block_bytes * t.qk, plan)(w, y, out)

    def mul_mat(self, w, qtype: str, x, order, out=None):
        return self.mul_mats(((w, qtype),), x, order, (out,))[0]

    def mul_mats(self, weights, x, order, outs=None) -> list:
        # x is quantized once per layout the launches read: the mat-vec kernel's own for Q4_K /
        # Q6_K weights, llama.cpp's for Q8_0 and for the MMA and tiled kernels.
        T = x.shape[0]
        mvs, layouts = self._layouts(weights, T, order)
        xqs = {layout: self.quantize(x, layout) for layout in layouts}
        return self._run_matvecs(weights, mvs, xqs, T, outs)

    # ---- fused sequences (hiraishin/kernels/fused: the unfused kernels' float ops, fewer launches)
    def _layouts(self, weights, T: int, order) -> tuple[list, list]:
        """The prepared mat-vecs of ``weights`` and the distinct activation layouts they read."""
        mvs = [self.matvec(order, T, qtype, w) for w, qtype in weights]
        layouts = list(dict.fromkeys(mv.layout for mv in mvs))  # distinct, in first-use order
        return mvs, layouts

    def _run_matvecs(self, weights, mvs, xqs, T: int, outs):
        """Every mat-vec of ``weights`` (prepared ``mvs``) on its activations ``xqs[layout]``; the
        ones of one group (Q, K, V of one type; gate and up) in one ``mmvq_multi`` launch, and two groups
        of different types (Q4_K Q and K, a Q6_K V) in one ``mmvq_mixed`` launch."""
        results = [self._empty((T, mv.n), _F32) if outs is None or outs[i] is None else outs[i]
                   for i, mv in enumerate(mvs)]
        groups: dict = {}
        for i, mv in enumerate(mvs):
            groups.setdefault(mv.group if mv.group is not None else ("alone", i), []).append(i)
        pair = mixed_groups(groups, len(mvs))
        if pair is not None:  # two types in one mmvq_mixed launch (Q4_K Q, K beside a Q6_K V)
            (_, ia), (_, ib) = pair
            self._mixed_launch(pair, mvs, T)([weights[i][0] for i in ia + ib], xqs[mvs[ia[0]].layout],
                                             xqs[mvs[ib[0]].layout], [results[i] for i in ia + ib])
            return results
        for key, idx in groups.items():
            if key[0] == "alone" or len(idx) == 1:
                for i in idx:
                    mvs[i](weights[i][0], xqs[mvs[i].layout], results[i])
                continue
            for start in range(0, len(idx), MULTI_MAX_WEIGHTS):
                part = idx[start:start + MULTI_MAX_WEIGHTS]
                multi = self._multi_launch(key, tuple(mvs[i].n for i in part), T)
                multi([weights[i][0] for i in part], xqs[mvs[part[0]].layout], [results[i] for i in part])
        return results

    def _mixed_launch(self, pair: tuple, mvs, T: int):
        """The ``mmvq_mixed`` launch (cached) of two groups that :func:`~.cuda_matvec.mixed_groups` paired (the
        weights of the first group first, as they come)."""
        (ka, ia), (kb, ib) = pair
        pa, pb = ka[2], kb[2]
        ns = tuple(mvs[i].n for i in ia + ib)
        cache_key = ("mixed", ka, kb, ns, T)
        hit = self._multis.get(cache_key)
        if hit is None:
            ta = matvec_traits(ka[0])
            k = ka[1] // ta.block_bytes * ta.qk
            hit = self._multis[cache_key] = MixedMatVecLaunch(
                tuple(mvs[i].qtype for i in ia + ib), ns,
                tuple(pa.rows_per_block for _ in ia) + tuple(pb.rows_per_block for _ in ib), k, T, pa.nwarps)
        return hit

    def _multi_launch(self, key, ns: tuple, T: int):
        hit = self._multis.get((key, ns))
        if hit is None:
            qtype, row_bytes, plan = key[:3]
            t = matvec_traits(qtype)
            if isinstance(plan, SubBlockPlan):  # (key[3]: the weights are in tile records)
                hit = self._multis[(key, ns)] = MMQMultiLaunch(ns, plan, key[3])
            else:
                hit = self._multis[(key, ns)] = MultiMatVecLaunch(qtype, ns, row_bytes // t.block_bytes * t.qk, T,
                                                                 plan.rows_per_block, plan.nwarps)
        return hit

    def norm_matvecs(self, x, norm_w, eps: float, weights, order, outs=None, residual=None, out_sum=None,
                     argmax=None):
        """``rms_norm(x [+ residual])`` quantized straight into the layout the first weight's mat-vec
        reads, and into a second mat-vec layout (a Q6_K weight beside Q4_K ones) in the same launch,
        then every mat-vec; any further layout quantizes the normed floats. Or, where
        :meth:`_norm_mmvq_launches` allows (off by default: measured slower), the norm inside each
        mat-vec launch. Returns ``(results, s)``: the outputs and ``x + residual`` (``out_sum``; None
        without a residual). ``argmax`` = ``(token, advance, pos)`` (one weight: a pass's output head):
        also each row's greedy token into ``token`` as :meth:`argmax_rows` (``advance``: its advance and
        log, or None), in the head's own launch where ``HIRAISHIN_HEAD_ARGMAX=1`` allows (one token, a
        one-column mat-vec plan: the same logits, the same token; with the norm fused too, the pass's end is
        one launch, ``hx_norm_mmvq_argmax``)."""
        T, n = x.shape
        mvs, layouts = self._layouts(weights, T, order)
        fused = self._norm_mmvq_launches(mvs, T, n, eps, head=argmax is not None)
        if fused is not None:  # the norm inside every mat-vec launch (norm_mmvq): the same bits
            results = [self._empty((T, mv.n), _F32) if outs is None or outs[i] is None else outs[i]
                       for i, mv in enumerate(mvs)]
            s = None if residual is None else self._empty((T, n), _F32) if out_sum is None else out_sum
            if isinstance(fused[0][0], NormArgmaxLaunch):  # and the greedy token: the pass's end in one launch
                token, advance, pos = argmax
                fused[0][0](x, residual, norm_w, s, weights[0][0], results[0], token, pos, *(advance or (None, None)))
                return results, s
            for at, (launch, idx) in enumerate(fused):  # the first launch writes the residual sum
                launch(x, residual, norm_w, s if at == 0 else None, [weights[i][0] for i in idx],
                       [results[i] for i in idx])
            if argmax is not None:
                self.argmax_rows(results[0], out=argmax[0], advance=argmax[1], pos=argmax[2])
            return results, s
        norm, s = self._norm_launch(x, norm_w, eps, residual, out_sum)
        return self._normed_matvecs(norm, weights, mvs, layouts, T, n, outs, argmax), s

    def _norm_launch(self, x, norm_w, eps: float, residual, out_sum):
        """``(norm, s)``: the norm launch of :meth:`_normed_matvecs` for ``rms_norm(x [+ residual])`` and the
        sum's buffer (``out_sum`` or a new one; None without a residual)."""
        T, n = x.shape
        s = None if residual is None else self._empty((T, n), _F32) if out_sum is None else out_sum

        def norm(xq, normed, first, xq2, second):
            if residual is None:
                launch_rms_norm_q8_1(x, norm_w, eps, xq, normed, first, xq2, second)
            else:
                launch_add_rms_norm_q8_1(x, residual, norm_w, eps, s, xq, normed, first, xq2, second)

        return norm, s

    def embed_norm_matvecs(self, table, qtype: str, ids, norm_w, eps: float, weights, order, outs=None,
                           out_rows=None):
        """A pass's start: the rows of the embedding ``table`` at the device token ``ids`` (dequantized),
        then :meth:`norm_matvecs` of them. Returns ``(results, rows)``. With ``HIRAISHIN_EMBED_NORM=1``
        (``kernels.fused.launch.EMBED_NORM``) one launch does the embedding and the norm (the same bits);
        else a get_rows launch, then the norm's."""
        n = get_rows_width(table.shape, qtype)
        T = ids.size
        rows = self._empty((T, n), _F32) if out_rows is None else out_rows
        if not fused_launch.EMBED_NORM:
            self.get_rows(table, qtype, ids, out=rows)
            return self.norm_matvecs(rows, norm_w, eps, weights, order, outs)[0], rows
        mvs, layouts = self._layouts(weights, T, order)

        def norm(xq, normed, first, xq2, second):
            launch_embed_rms_norm_q8_1(table, qtype, ids, norm_w, eps, rows, xq, normed, first, xq2, second)

        return self._normed_matvecs(norm, weights, mvs, layouts, T, n, outs), rows

    def _normed_matvecs(self, norm, weights, mvs, layouts, T: int, n: int, outs, argmax=None):
        """:meth:`_normed` activations, then every mat-vec (and ``argmax``: see :meth:`norm_matvecs`)."""
        xqs = self._normed(norm, layouts, T, n)
        head = None if argmax is None else self._head_argmax(mvs, T)
        if head is not None:  # the head and its greedy token in one launch
            token, advance, pos = argmax
            out = self._empty((T, mvs[0].n), _F32) if outs is None or outs[0] is None else outs[0]
            head(weights[0][0], xqs[mvs[0].layout], out, token, pos, *(advance or (None, None)))
            return [out]
        results = self._run_matvecs(weights, mvs, xqs, T, outs)
        if argmax is not None:
            self.argmax_rows(results[0], out=argmax[0], advance=argmax[1], pos=argmax[2])
        return results

    def _normed(self, norm, layouts, T: int, n: int) -> dict:
        """``{layout: q8_1 activations}``: ``norm(xq, normed, first, xq2, second)`` (a norm launch) writes the
        normed rows as q8_1 in the first of ``layouts`` (``xq``) and in a second one (``xq2``, a Q6_K weight
        beside Q4_K ones), and the normed floats when a further layout quantizes them (``normed``, else
        None)."""
        first = layouts[0]
        xq = self._q8_1_scratch(T, n, first)
        # a second layout comes from the same launch (yq2); any further one quantizes the normed floats
        second = layouts[1] if len(layouts) > 1 and layouts[1] is not None else None
        xq2 = self._q8_1_scratch(T, n, second) if second else None
        rest = [layout for layout in layouts[1:] if layout != second]
        normed = self.scratch("normed", (T, n)) if rest else None
        norm(xq, normed, first, xq2, second)
        xqs = {first: xq}
        if second:
            xqs[second] = xq2
        for layout in rest:
            xqs[layout] = self.quantize(normed, layout)
        return xqs

    def norm_swiglu_matvec(self, x, norm_w, eps: float, gate, up, down, order, outs=None, residual=None,
                           out_sum=None, between=None):
        """A feed-forward block (``CpuOps.norm_swiglu_matvec``): the norm of ``x`` (+ ``residual``), the
        ``gate`` and ``up`` mat-vecs, ``between()`` (if given), then SwiGLU into ``down``'s mat-vec. With
        ``HIRAISHIN_SWIGLU_EPILOGUE=1`` (``kernels.mmvq_swiglu``; off: measured slower on the H200) where gate and
        up share one mmvq launch, SwiGLU and its q8_1 are that launch's epilogue (``mmvq_swiglu``: the same bits,
        one launch fewer)."""
        T, n = x.shape
        outs = outs or (None, None, None)
        fused = None
        if swiglu_epilogue_enabled():
            mvs, layouts = self._layouts((gate, up), T, order)
            fused = self._swiglu_launch(mvs, down, T, order)
        if fused is None:
            return feed_forward_steps(self, x, norm_w, eps, gate, up, down, order, outs, residual, out_sum, between)
        launch, down_mv = fused
        norm, s = self._norm_launch(x, norm_w, eps, residual, out_sum)
        xqs = self._normed(norm, layouts, T, n)
        g, u = (self._empty((T, mv.n), _F32) if o is None else o for mv, o in zip(mvs, outs))
        yq = self._q8_1_scratch(T, mvs[0].n, down_mv.layout)
        launch(gate[0], up[0], xqs[mvs[0].layout], g, u, yq)
        if between is not None:
            between()
        return self._run_matvecs((down,), [down_mv], {down_mv.layout: yq}, T, outs[2:])[0], s

    def swiglu_matvec(self, g, u, weight, order, out=None):
        """``silu(g) * u`` quantized straight into the down projection's layout (one fused launch),
        then its mat-vec. With ``HIRAISHIN_SWIGLU_DOWN=N`` (``kernels.swiglu_down``; off by default, not yet
        timed) a pass of at most N tokens whose down mat-vec is one mmvq launch makes the product inside
        that launch (``hx_swiglu_down``: the same bits, one launch fewer)."""
        T, k = g.shape
        mvs, (layout,) = self._layouts((weight,), T, order)
        fused = self._swiglu_down_launch(mvs[0], T, k) if 0 < T <= swiglu_down_tokens() else None
        if fused is not None:
            return fused(g, u, weight[0], self._empty((T, mvs[0].n), _F32) if out is None else out)
        xq = self._q8_1_scratch(T, k, layout)
        launch_swiglu_q8_1(g, u, xq, None, layout)
        return self._run_matvecs((weight,), mvs, {layout: xq}, T, (out,))[0]

    def _q8_1_scratch(self, T: int, K: int, layout):
        """The reused buffer of (T, K) activations' q8_1 bytes in ``layout`` (one per shape and layout). An
        MMA8 buffer holds whole groups of 8 columns (one buffer serves every width of the same group count) and
        the sub-block kernels also read the padding columns past a pass's last one (and drop what they
        compute), so the buffer starts as zeros: a padding column holds 0 or an earlier pass's values, never
        uninitialized memory."""
        return self.scratch(f"q8_1 {layout}", quantize_output_shape(T, K, layout), _U8,
                            zeroed=layout in LAYOUT_COLUMN_GROUP)


class CudaBackend(Backend):
    name = "cuda"
    writes_out = True

    def __init__(self, device=None):
        self.xp = require_cupy()  # BackendError naming what is missing (CuPy, driver, device)
        if isinstance(device, str) and device == "current":
            # this GPU's SM count and our kernels' measured occupancy, as one DeviceProfile that
            # both the mat-vec and the attention planners accept
            device = current_profile()
        super().__init__(device)
        self.tiled: set[int] = set()  # device pointers of weights laid out as tiles (relayout_weight)
        self.ops = CudaOps(self)

    def to_device(self, a):
        return self.xp.asarray(a)

    def to_host(self, a) -> np.ndarray:
        return self.xp.asnumpy(a)

    def upload_weight(self, a):
        return self.xp.asarray(np.ascontiguousarray(a))

    def relayout_weight(self, data, name: str, qtype: str, shape: tuple, tiles: bool) -> bool:
        """Lay weight ``name``'s device ``data`` out as 16-row tile records (``tiles``; a projection of whole tiles
        and a type :func:`~hiraishin.kernels.mmq.wtile.tiles_weight` takes) or ggml's rows, in place (the same
        buffer: the pointers a captured graph holds stay valid, not what it reads); True if its bytes moved. A tiled
        weight's pointer is kept in :attr:`tiled`, so that only sub-block mat-vecs read it."""
        ptr = data.data.ptr
        if not tiles:  # (by what is tiled, whatever the switches say now)
            if ptr not in self.tiled:
                return False
            data[...] = untile_weight(data, qtype, self.xp)
            self.tiled.discard(ptr)
            return True
        if ptr in self.tiled or not tiles_weight(name, qtype, shape):
            return False
        data[...] = tile_weight(data, qtype, self.xp)
        self.tiled.add(ptr)
        try:  # forget the pointer with the array, so that a later allocation there is not taken for tiles
            weakref.finalize(data, self.tiled.discard, ptr)
        except TypeError:  # (an array type without weak references: the pointer stays marked)
            pass
        return True

    def synchronize(self) -> None:
        self.xp.cuda.get_current_stream().synchronize()

    def memory_used(self) -> int:
        """Bytes held by CuPy's default memory pool."""
        return int(self.xp.get_default_memory_pool().used_bytes())

    def mul_mats(self, weights, x, order, outs=None) -> list:
        # the kernels load ints (Q4_K) or 16-bit halves: a misaligned weight view is an error
        for w, qtype in weights:
            align = WEIGHT_ALIGNMENT.get(qtype, 1)
            if type(w) is self.xp.ndarray and w.data.ptr % align:
                raise BackendError(f"{qtype} weight {tuple(w.shape)} must be {align}-byte aligned on the GPU")
        return super().mul_mats(weights, x, order, outs)

    def write_kv(self, cache, layer: int, start_pos: int, k, v) -> None:
        T = k.shape[0] if len(getattr(k, "shape", ())) == 3 else -1
        if not (getattr(cache, "backend", None) == "cuda" and type(k) is self.xp.ndarray and type(v) is self.xp.ndarray
                and k.dtype == _F32 and v.dtype == _F32 and k.flags.c_contiguous and v.flags.c_contiguous
                and k.shape == v.shape and k.shape[1:] == (cache.n_head_kv, cache.head_dim)
                and isinstance(start_pos, int) and 0 <= start_pos <= cache.length and start_pos + T <= cache.n_ctx):
            return cache.write(layer, start_pos, k, v)  # checks, and raises the clear error
        self.ops.write_kv(cache, layer, start_pos, k, v)
