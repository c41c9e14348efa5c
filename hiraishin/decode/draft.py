"""Draft models derived from a target: the target's weights plus seeded noise, requantized.

A speculative test needs a draft that agrees with the target often but not
always, so that both the accept and the reject paths run. ``noise`` tunes the
agreement: 0 gives the target's own bytes back (self-speculation), larger
values give more rejections; ``n_layer`` keeps only the first layers (a
cheaper, worse draft).
"""

from __future__ import annotations

import zlib
from os import PathLike
from pathlib import Path

import numpy as np

from ..atomic import atomic_path
from ..errors import GGUFError

__all__ = ["write_draft"]

_BLOCK_COUNT_SUFFIX = ".block_count"


def _copy_metadata(reader, writer, n_layer: int | None, arch: str):
    from gguf import GGUFValueType

    for field in reader.fields.values():
        if field.name.startswith("GGUF.") or field.name == "general.architecture":
            continue
        vtype = field.types[0]
        value = field.contents()
        if n_layer is not None and field.name == f"{arch}{_BLOCK_COUNT_SUFFIX}":
            value = n_layer
        sub = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, value, vtype, sub_type=sub)


def _layer_of(name: str) -> int | None:
    parts = name.split(".")
    if parts[0] == "blk" and len(parts) > 1 and parts[1].isdigit():
        return int(parts[1])
    return None


def _perturb(data: np.ndarray, qtype: str, noise: float, rng: np.random.Generator, name: str) -> np.ndarray:
    """Dequantize, add Gaussian noise of ``noise`` times the tensor's std, requantize to ``qtype``."""
    from ..quant import dequantize, quantize

    x = dequantize(data, qtype).astype(np.float32)
    std = float(np.std(x, dtype=np.float64))
    if std == 0.0:
        std = float(np.mean(np.abs(x), dtype=np.float64)) or 1.0
    x = x + (rng.standard_normal(x.shape) * (noise * std)).astype(np.float32)
    try:
        return quantize(x, qtype)
    except Exception as e:  # name the tensor in the error
        raise GGUFError(f"draft: cannot requantize tensor {name!r} as {qtype}: {e}") from e


def write_draft(target_path: str | PathLike, out_path: str | PathLike, noise: float = 0.05,
                seed: int = 0, n_layer: int | None = None) -> Path:
    """Write a draft GGUF: ``target_path``'s tensors plus seeded noise, in the same quant types.

    Args:
        target_path: the target model's GGUF.
        out_path: where to write the draft.
        noise: noise standard deviation as a fraction of each tensor's standard
            deviation (0: the target's bytes, unchanged).
        seed: the noise seed; each tensor's noise also depends on its name, so it
            does not depend on tensor order.
        n_layer: keep only layers ``0..n_layer-1`` (None: all).

    Returns:
        ``out_path`` as a Path.
    """
    from gguf import GGUFReader, GGUFWriter

    from ..quant import qtype_name

    target_path, out_path = Path(target_path), Path(out_path)
    if noise < 0:
        raise GGUFError(f"draft noise must be >= 0, got {noise}")
    try:
        reader = GGUFReader(target_path)
    except Exception as e:
        raise GGUFError(f"{target_path}: cannot read as GGUF ({e})") from e
    arch_field = reader.fields.get("general.architecture")
    if arch_field is None:
        raise GGUFError(f"{target_path}: missing key general.architecture")
    arch = arch_field.contents()
    block_field = reader.fields.get(f"{arch}{_BLOCK_COUNT_SUFFIX}")
    if n_layer is not None:
        total = block_field.contents() if block_field is not None else None
        if n_layer < 1 or (total is not None and n_layer > total):
            raise GGUFError(f"draft n_layer must be in 1..{total} ({target_path}'s "
                            f"{arch}{_BLOCK_COUNT_SUFFIX}), got {n_layer}")

    out_path.parent.mkdir(parents=True, exist_ok=True)
    # a unique temporary name beside out_path, renamed over it once complete (hiraishin.atomic)
    with atomic_path(out_path) as tmp:
        writer = GGUFWriter(tmp, arch)
        try:
            _copy_metadata(reader, writer, n_layer, arch)
            for t in reader.tensors:
                layer = _layer_of(t.name)
                if n_layer is not None and layer is not None and layer >= n_layer:
                    continue
                qtype = qtype_name(t.tensor_type)
                data = np.asarray(t.data)
                if noise:
                    rng = np.random.default_rng([seed, zlib.crc32(t.name.encode())])
                    data = _perturb(data, qtype, noise, rng, t.name)
                if qtype in ("F32", "F16"):
                    writer.add_tensor(t.name, np.ascontiguousarray(data))
                else:
                    writer.add_tensor(t.name, np.ascontiguousarray(data), raw_shape=data.shape,
                                      raw_dtype=t.tensor_type)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
    return out_path
