"""Input checks of the backends' ops, once for both backends.

Each check takes numpy or CuPy arrays (only ``shape``, ``dtype`` and ``ndim`` are read, never the
data, except host positions and token ids, whose range is checked where reading them costs no
device sync) and raises the library's error naming the op, the argument and what was expected.
The kernels and emulators themselves check nothing: an op takes arrays that passed these checks.
"""

from __future__ import annotations

import numpy as np

from ..errors import BackendError, PlanError, QuantError
from ..plans.attention import HEAD_DIMS, AttentionPlan
from ..plans.matvec import MATVEC_TRAITS, MatVecPlan
from ..plans.mmq_stock import MMQStockPlan
from ..plans.subblock import SubBlockPlan
from ..quant import BLOCK_BYTES, BLOCK_ELEMS

__all__ = [
    "GET_ROWS_TYPES",
    "check_rms_norm",
    "check_rope",
    "check_rope_positions",
    "check_pair",
    "check_get_rows",
    "get_rows_width",
    "check_weight",
    "check_q8_1",
    "check_activations",
    "check_matvec_plan",
    "check_attention",
    "check_attention_plan",
    "check_combine",
    "is_cupy",
]

# Table types get_rows reads (the token embedding of a Q4_K_M file is Q4_K or Q6_K).
GET_ROWS_TYPES = ("Q4_K", "Q6_K", "Q8_0", "F16", "F32")


def is_cupy(a) -> bool:
    """True for a CuPy array (without importing CuPy)."""
    return type(a).__module__.split(".")[0] == "cupy"


def check_rms_norm(x, w) -> None:
    if x.ndim != 2 or w.ndim != 1 or x.shape[1] != w.shape[0]:
        raise BackendError(f"rms_norm: x must be (rows, n) and w (n,), got x {tuple(x.shape)}, w {tuple(w.shape)}")
    if x.dtype != np.float32 or w.dtype != np.float32:
        raise BackendError(f"rms_norm: needs float32 x and w, got {x.dtype}, {w.dtype}")


def check_rope(x, pos, cos_t, sin_t) -> None:
    if x.ndim != 3 or x.shape[2] % 2 or x.dtype != np.float32:
        raise BackendError(f"rope: x must be float32 (T, n_head, head_dim even), got {x.dtype} {tuple(x.shape)}")
    if tuple(pos.shape) != (x.shape[0],):
        raise BackendError(f"rope: pos must have shape ({x.shape[0]},), got {tuple(pos.shape)}")
    if tuple(cos_t.shape) != tuple(sin_t.shape) or cos_t.ndim != 2 or cos_t.shape[1] != x.shape[2] // 2:
        raise BackendError(f"rope: tables {tuple(cos_t.shape)}/{tuple(sin_t.shape)} do not fit head_dim {x.shape[2]}")


def check_rope_positions(pos: np.ndarray, n_ctx: int) -> None:
    """Host positions must lie in the RoPE table (device positions are not read back: a sync)."""
    if len(pos) and (int(pos.min()) < 0 or int(pos.max()) >= n_ctx):
        raise BackendError(f"rope: positions {int(pos.min())}..{int(pos.max())} outside the table (n_ctx {n_ctx})")


def check_pair(name: str, a, b) -> None:
    if tuple(a.shape) != tuple(b.shape) or a.dtype != np.float32 or b.dtype != np.float32:
        raise BackendError(f"{name}: needs two float32 arrays of one shape, got {a.dtype}{tuple(a.shape)}, "
                           f"{b.dtype}{tuple(b.shape)}")


def get_rows_width(table_shape, qtype: str) -> int:
    """Values per row of a byte table of ``qtype``."""
    if qtype not in GET_ROWS_TYPES:
        raise BackendError(f"get_rows: unsupported table type {qtype!r}; supported: {sorted(GET_ROWS_TYPES)}")
    row_bytes = table_shape[1]
    if row_bytes % BLOCK_BYTES[qtype]:
        raise BackendError(f"get_rows: {qtype} row of {row_bytes} bytes is not a whole number of blocks")
    return row_bytes // BLOCK_BYTES[qtype] * BLOCK_ELEMS[qtype]


def check_get_rows(table, qtype: str, ids) -> int:
    """Checks a byte table and ids (host ids: their range too); returns the row width."""
    width = get_rows_width(table.shape, qtype)
    if ids.ndim != 1:
        raise BackendError(f"get_rows: ids must be 1-D, got shape {tuple(ids.shape)}")
    if isinstance(ids, np.ndarray) and ids.size and (int(ids.min()) < 0 or int(ids.max()) >= table.shape[0]):
        raise BackendError(f"get_rows: token ids {int(ids.min())}..{int(ids.max())} outside the table's "
                           f"{table.shape[0]} rows")
    return width


def check_weight(w, qtype: str) -> tuple[int, int]:
    """(N, K) of a mat-vec weight, or a :class:`QuantError` naming its shape and type."""
    t = MATVEC_TRAITS.get(qtype) if isinstance(qtype, str) else None
    if t is None:
        raise QuantError(f"mat-vec weights must be one of {sorted(MATVEC_TRAITS)}, got qtype {qtype!r}")
    if w.ndim != 2 or w.dtype != np.uint8:
        raise QuantError(f"{qtype} weight must be a uint8 array (N rows, row_bytes); got {w.dtype} {tuple(w.shape)}")
    n, row_bytes = w.shape
    if row_bytes == 0 or row_bytes % t.block_bytes:
        raise QuantError(f"{qtype} weight of shape {tuple(w.shape)}: row_bytes={row_bytes} is not a positive "
                         f"multiple of the {t.block_bytes}-byte block")
    return n, row_bytes // t.block_bytes * t.qk


def check_q8_1(xq, qtype: str, k: int, w_shape) -> int:
    """q8_1 activations (llama.cpp's layout) for a weight of K values per row; returns ncols."""
    expect = k // BLOCK_ELEMS["Q8_1"] * BLOCK_BYTES["Q8_1"]
    if xq.ndim != 2 or xq.dtype != np.uint8 or xq.shape[1] != expect:
        raise QuantError(f"q8_1 activations for a {qtype} weight of shape {tuple(w_shape)} (K={k}) must be uint8 "
                         f"(ncols, {expect}); got {xq.dtype} {tuple(xq.shape)}")
    return xq.shape[0]


def check_activations(x, k: int | None = None, what: str = "activations") -> None:
    """float32 (ncols, K) activations with K a positive multiple of 32 (and equal to ``k`` if given)."""
    if x.ndim != 2 or x.dtype != np.float32:
        raise QuantError(f"{what} must be float32 (ncols, K); got {x.dtype} {tuple(x.shape)}")
    if k is not None and x.shape[1] != k:
        raise QuantError(f"{what} must be float32 (ncols, {k}); got {x.dtype} {tuple(x.shape)}")
    if x.shape[1] == 0 or x.shape[1] % BLOCK_ELEMS["Q8_1"]:
        raise QuantError(f"{what}: K = {x.shape[1]} (shape {tuple(x.shape)}) is not a positive multiple of 32")


def check_matvec_plan(plan, qtype: str, ncols: int, xq_shape, k: int | None = None) -> None:
    if not isinstance(plan, (MatVecPlan, SubBlockPlan, MMQStockPlan)):
        raise PlanError(f"a mat-vec needs a MatVecPlan, SubBlockPlan or MMQStockPlan, got {type(plan).__name__}")
    if plan.qtype != qtype:
        raise PlanError(f"plan is for {plan.qtype} but the weight is {qtype}")
    if ncols != plan.ncols:
        raise PlanError(f"plan is for {plan.ncols} columns but xq has {ncols} (shape {tuple(xq_shape)})")
    if isinstance(plan, MMQStockPlan) and not plan.shaped:
        raise PlanError("a stock MMQ plan needs the weight's shape: plans.matvec_plan(..., k=..., n=...)")
    if isinstance(plan, (SubBlockPlan, MMQStockPlan)) and k is not None and plan.k != k:
        raise PlanError(f"plan is for rows of K={plan.k} values but the weight has K={k}")


def check_attention(q, k_cache, v_cache, q_pos, kv_len: int) -> None:
    """Shapes and dtypes of one attention launch; host positions must lie in ``0..kv_len-1``."""
    for name, arr in (("q", q), ("k_cache", k_cache), ("v_cache", v_cache)):
        if not hasattr(arr, "shape") or len(arr.shape) != 3:
            raise PlanError(f"{name} must be a 3-D array, got shape {getattr(arr, 'shape', None)}")
    if q.dtype != np.float32:
        raise PlanError(f"q must be float32 (T, n_head, D), got {q.dtype}")
    for name, arr in (("k_cache", k_cache), ("v_cache", v_cache)):
        if arr.dtype != np.float16:
            raise PlanError(f"{name} must be float16 (n_ctx, n_head_kv, D), got {arr.dtype}")
        if not arr.flags.c_contiguous:
            raise PlanError(f"{name} must be C-contiguous")
    if tuple(k_cache.shape) != tuple(v_cache.shape):
        raise PlanError(f"k_cache {tuple(k_cache.shape)} and v_cache {tuple(v_cache.shape)} differ in shape")
    T, H, D = q.shape
    n_ctx, Hkv, Dk = k_cache.shape
    if D != Dk:
        raise PlanError(f"q head dim {D} (q shape {tuple(q.shape)}) != cache head dim {Dk} "
                        f"(cache shape {tuple(k_cache.shape)})")
    if D not in HEAD_DIMS:
        raise PlanError(f"head dim must be one of {HEAD_DIMS}, got {D} (q shape {tuple(q.shape)})")
    if T < 1 or Hkv < 1 or H % Hkv:
        raise PlanError(f"q shape {tuple(q.shape)} vs cache shape {tuple(k_cache.shape)}: need T >= 1 and "
                        f"n_head a multiple of n_head_kv")
    if isinstance(kv_len, bool) or int(kv_len) != kv_len or not 1 <= kv_len <= n_ctx:
        raise PlanError(f"kv_len must be in 1..n_ctx ({n_ctx}), got {kv_len}")
    if tuple(q_pos.shape) != (T,) or q_pos.dtype.kind not in "iu":
        raise PlanError(f"q_pos must be an integer array of shape ({T},), got {q_pos.dtype} {tuple(q_pos.shape)}")
    # device positions are only compared with cell indices in the kernels, never used as
    # addresses, and reading them back would sync: host positions are range-checked
    if isinstance(q_pos, np.ndarray) and T and (q_pos.min() < 0 or q_pos.max() >= kv_len):
        raise PlanError(f"q_pos must lie in 0..kv_len-1 = 0..{kv_len - 1} (a query sees its own cell), "
                        f"got min {q_pos.min()} max {q_pos.max()}")


def check_attention_plan(plan, q, k_cache) -> int:
    """The plan fits the inputs; returns its KV length."""
    if not isinstance(plan, AttentionPlan):
        raise PlanError(f"attention needs an AttentionPlan, got {type(plan).__name__}")
    kv_len = plan.kv_len if plan.kv_len is not None else plan.kv_attended
    if kv_len > k_cache.shape[0]:
        raise PlanError(f"kv_len must be in 1..n_ctx ({k_cache.shape[0]}) of the cache, got {kv_len} (from the plan)")
    T, H, D = q.shape
    for field, want in (("n_queries", T), ("n_head", H), ("n_head_kv", k_cache.shape[1]), ("kv_len", kv_len)):
        have = getattr(plan, field)
        if have is not None and have != want:
            raise PlanError(f"plan.{field} = {have} but the inputs have {want} "
                            f"(q {tuple(q.shape)}, cache {tuple(k_cache.shape)})")
    if plan.head_dim != D:
        raise PlanError(f"plan.head_dim = {plan.head_dim} but q has head dim {D}")
    return kv_len


def check_combine(parts, meta) -> None:
    if len(parts.shape) != 4 or tuple(meta.shape) != tuple(parts.shape[:3]) + (2,):
        raise PlanError(f"combine needs parts (T, H, P, D) and meta (T, H, P, 2), got "
                        f"{tuple(parts.shape)} and {tuple(meta.shape)}")
    if parts.shape[3] not in HEAD_DIMS:
        raise PlanError(f"combine: head dim must be one of {HEAD_DIMS}, got {parts.shape[3]}")
