"""Qwen3 weights on a backend, kept in their GGUF block format.

Quantized matrices stay quantized (uint8 (N, row_bytes), exactly the file's bytes): the mat-vec
kernels read the blocks, and the embedding lookup dequantizes only the rows it needs. So device
memory is the file's tensor bytes plus the KV cache plus activations. On the CPU backend the
tensors stay memory-mapped (no copy). Tied embeddings share one array.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import DeviceMemoryError, GGUFError
from ..quant import dequantize
from .config import LAYER_TENSORS

__all__ = ["Weight", "LayerWeights", "Qwen3Weights", "load_weights", "MATMUL_TYPES", "NORM_TYPES",
           "is_out_of_memory", "release_cached_memory", "free_device_bytes", "format_bytes", "check_memory_fits",
           "kv_cache_bytes", "host_available_bytes", "GIB"]

GIB = float(1 << 30)
# The KV cache holds K and V (2 arrays) of float16 (2 bytes) per layer, cell, KV head and head dim.
KV_ARRAYS = 2
KV_ELEMENT_BYTES = 2

# Block types the mat-vec kernels read (hiraishin.kernels.mmvq). Norm weights are F32 in llama.cpp
# files (every 1-D tensor stays F32 when quantizing, reference section 8.4); F16/BF16 ones are
# widened to float32 at load (exact).
MATMUL_TYPES = ("Q4_K", "Q6_K", "Q8_0")
NORM_TYPES = ("F32", "F16", "BF16")


@dataclass(frozen=True)
class Weight:
    """One tensor on a backend: ``data`` is uint8 (N, row_bytes) for block types, float32 (n,) for norms.

    ``shape`` is the ggml shape (ne0 = K columns, ne1 = N rows).
    """

    name: str
    qtype: str
    shape: tuple[int, ...]
    data: object

    @property
    def nbytes(self) -> int:
        return int(self.data.nbytes)


@dataclass(frozen=True)
class LayerWeights:
    attn_norm: Weight
    attn_q: Weight
    attn_k: Weight
    attn_v: Weight
    attn_output: Weight
    attn_q_norm: Weight
    attn_k_norm: Weight
    ffn_norm: Weight
    ffn_gate: Weight
    ffn_up: Weight
    ffn_down: Weight


@dataclass(frozen=True)
class Qwen3Weights:
    token_embd: Weight
    output_norm: Weight
    output: Weight  # token_embd itself when the embeddings are tied
    layers: tuple[LayerWeights, ...]

    @property
    def nbytes(self) -> int:
        """Bytes of weight data held on the backend (a tied table counted once)."""
        seen, total = set(), 0
        for w in self._all():
            if id(w.data) not in seen:
                seen.add(id(w.data))
                total += w.nbytes
        return total

    def _all(self):
        yield self.token_embd
        yield self.output_norm
        yield self.output
        for layer in self.layers:
            for part in LAYER_TENSORS:
                yield getattr(layer, part)


def _expected(config) -> dict[str, tuple[tuple[int, ...], tuple[str, ...]]]:
    shapes = config.tensor_shapes()
    return {name: (shape, NORM_TYPES if len(shape) == 1 else MATMUL_TYPES) for name, shape in shapes.items()}


def load_weights(gguf, backend, progress: bool = True) -> Qwen3Weights:
    """Every tensor of an open :class:`~hiraishin.model.gguf_file.Qwen3GGUF` on ``backend``.

    Checks each tensor's presence, shape and type against the config and raises
    :class:`~hiraishin.errors.GGUFError` naming the file and the tensor. ``progress`` shows a
    tqdm bar over the bytes moved.
    """
    from tqdm.auto import tqdm

    where = str(getattr(gguf, "path", "<gguf>"))
    expected = _expected(gguf.config)
    for name, (shape, types) in expected.items():
        if name not in gguf.tensors:
            raise GGUFError(f"{where}: tensor {name!r} is missing")
        t = gguf.tensors[name]
        if tuple(t.shape) != shape:
            raise GGUFError(f"{where}: tensor {name!r} has shape {tuple(t.shape)}, expected {shape}")
        if t.qtype not in types:
            what = "the mat-vec kernels read" if types is MATMUL_TYPES else "norm weights may have"
            raise GGUFError(f"{where}: tensor {name!r} has type {t.qtype}; {what} only {', '.join(types)}")

    total = sum(int(gguf.tensors[n].data.nbytes) for n in expected)
    free = free_device_bytes(backend)
    if free is not None and total > free:  # refuse before allocating anything
        raise DeviceMemoryError(
            f"{where}: the weights need {format_bytes(total)} on {backend.name}, only {format_bytes(free)} "
            f"is free: a model fits if its tensor bytes and KV cache together stay under that; "
            f"use a smaller model or another device")
    loaded: dict[str, Weight] = {}
    done, current = 0, None
    try:
        with tqdm(total=total, unit="B", unit_scale=True, desc="loading weights", disable=not progress,
                  leave=False) as bar:
            for name, (shape, _) in expected.items():
                current = name
                t = gguf.tensors[name]
                data = t.data
                if len(shape) == 1:
                    data = dequantize(data, t.qtype).reshape(shape)  # float32 (n,)
                qtype = "F32" if len(shape) == 1 else t.qtype
                loaded[name] = Weight(name, qtype, shape, backend.upload_weight(data))
                done += int(t.data.nbytes)
                bar.update(int(t.data.nbytes))
    except Exception as exc:  # noqa: BLE001 - MemoryError, or CuPy's OutOfMemoryError (not a MemoryError)
        if not is_out_of_memory(exc):
            raise
        loaded.clear()  # release what was uploaded before saying so
        del exc
        release_cached_memory(backend)
        free = free_device_bytes(backend)
        fits = f"; {format_bytes(free)} is free now" if free is not None else ""
        raise DeviceMemoryError(
            f"{where}: out of memory on {backend.name} loading tensor {current!r} after {format_bytes(done)} of "
            f"{format_bytes(total)} of weights{fits}; released what was loaded") from None

    layers = tuple(
        LayerWeights(**{part: loaded[f"blk.{i}.{part}.weight"] for part in LAYER_TENSORS})
        for i in range(gguf.config.n_layer)
    )
    token_embd = loaded["token_embd.weight"]
    output = token_embd if gguf.config.tied_embeddings else loaded["output.weight"]
    return Qwen3Weights(token_embd=token_embd, output_norm=loaded["output_norm.weight"], output=output,
                        layers=layers)


def kv_cache_bytes(config, n_ctx: int) -> int:
    """Bytes of an f16 K/V cache of ``n_ctx`` cells for ``config``."""
    return KV_ARRAYS * KV_ELEMENT_BYTES * config.n_layer * int(n_ctx) * config.n_head_kv * config.head_dim


def check_memory_fits(gguf, backend, n_ctx: int, extra_bytes: int = 0) -> None:
    """Raise :class:`~hiraishin.errors.DeviceMemoryError` before anything is allocated if the
    model cannot fit, saying how many KV cells would.

    On a GPU: the weights of ``gguf`` plus a KV cache of ``n_ctx`` cells (plus ``extra_bytes``)
    against the device's free memory. On the CPU the weights stay memory-mapped, so only the KV
    cache (plus ``extra_bytes``) is checked, against the host's MemAvailable (/proc/meminfo; no
    check where that is unknown).
    """
    where = str(getattr(gguf, "path", "<gguf>"))
    free = free_device_bytes(backend)
    if free is not None:
        weights = sum(int(t.data.nbytes) for t in gguf.tensors.values())
        what, memory = f"the weights ({format_bytes(weights)}) and a KV cache", f"on {backend.name}"
    else:
        free = host_available_bytes()
        if free is None:
            return
        weights = 0
        what, memory = "a KV cache", "of host memory (MemAvailable)"
    cache = kv_cache_bytes(gguf.config, n_ctx)
    needed = weights + cache + int(extra_bytes)
    if needed <= free:
        return
    per_cell = kv_cache_bytes(gguf.config, 1)
    cells = max(0, (free - weights - int(extra_bytes)) // per_cell)
    fits = f"at most n_ctx = {cells} fits" + (" beside the weights" if weights else "") if cells > 0 \
        else "the weights alone do not fit"
    raise DeviceMemoryError(
        f"{where}: {what} of {n_ctx} cells ({format_bytes(cache)}) need {format_bytes(needed)}, "
        f"{format_bytes(free)} is free {memory}: {fits}")


def host_available_bytes() -> int | None:
    """The host's MemAvailable (/proc/meminfo) in bytes, or None where there is no such file."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def format_bytes(n: int) -> str:
    """``n`` bytes for a message: GiB from one GiB up, else MiB."""
    return f"{n / GIB:.2f} GiB" if n >= GIB else f"{n / (1 << 20):.1f} MiB"


def is_out_of_memory(exc: BaseException) -> bool:
    """Whether ``exc`` says an allocation failed: ``MemoryError``, or CuPy's ``OutOfMemoryError``
    (``cupy.cuda.memory.OutOfMemoryError`` is not a ``MemoryError`` subclass)."""
    return isinstance(exc, MemoryError) or type(exc).__name__ == "OutOfMemoryError"


def release_cached_memory(backend) -> None:
    """Give the blocks CuPy's memory pools keep cached back to the device (after arrays were
    dropped), so that ``memGetInfo`` and later allocations see them; a no-op on the CPU."""
    xp = getattr(backend, "xp", None)
    if xp is None or getattr(xp, "__name__", "") != "cupy":
        return
    try:
        xp.get_default_memory_pool().free_all_blocks()
        xp.get_default_pinned_memory_pool().free_all_blocks()
    except Exception:  # noqa: BLE001 - best effort: this only runs on the way to an error message
        pass


def free_device_bytes(backend) -> int | None:
    """Bytes a new allocation on ``backend`` can still get: the device's free memory plus what
    CuPy's pool holds unused; ``None`` on the CPU (host memory is not checked up front)."""
    xp = getattr(backend, "xp", None)
    if xp is None or getattr(xp, "__name__", "") != "cupy":
        return None
    try:
        pool = xp.get_default_memory_pool()
        free, _ = xp.cuda.runtime.memGetInfo()
        return int(free) + int(pool.total_bytes() - pool.used_bytes())
    except Exception:  # noqa: BLE001 - no answer: no up-front check
        return None
