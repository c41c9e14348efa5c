"""Helpers shared by the benchmark scripts in bench/ (GPU timing, provenance).

The scripts run as ``python bench/<script>.py``, so this module is imported as ``benchlib``
(the script's folder is first on ``sys.path``).
"""

from __future__ import annotations

import math
import os
import statistics
import subprocess

import numpy as np

SPIN_SRC = r"""
extern "C" __global__ void hx_bench_spin(long long cycles) {
    long long start = clock64();
    while (clock64() - start < cycles) { }
}
"""


def git_commit() -> str:
    """$HIRAISHIN_COMMIT if set (a copied tree whose .git may be missing or stale), else the
    checkout's commit, else "unknown"."""
    if os.environ.get("HIRAISHIN_COMMIT"):
        return os.environ["HIRAISHIN_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              check=True).stdout.strip()
    except Exception:
        return "unknown"


# Rows of a weight a benchmark checks against the CPU emulator before timing (rows are
# independent in every kernel: the first rows of the output are the emulator's output of the
# first rows of the weight; a whole 151936-row output head would take minutes on the CPU).
VALIDATE_ROWS = 256


class BitMismatch(AssertionError):
    """A kernel's output differs from its emulator's: the benchmark must not time it."""


def assert_same_bits(what: str, got, want) -> None:
    """Raise :class:`BitMismatch` unless ``got`` and ``want`` (host arrays) are bit-identical.

    Every benchmark checks the kernel it times against its emulator first (as llm.c checks its
    kernels against the CPU reference before timing them): a fast wrong kernel is not a result.
    """
    got, want = np.ascontiguousarray(got), np.ascontiguousarray(want)
    if got.shape != want.shape or got.dtype != want.dtype:
        raise BitMismatch(f"{what}: got {got.dtype}{got.shape}, emulator {want.dtype}{want.shape}")
    g, w = got.reshape(-1).view(np.uint8), want.reshape(-1).view(np.uint8)
    if not np.array_equal(g, w):
        bad = np.flatnonzero(g != w) // got.itemsize
        raise BitMismatch(f"{what}: {len(np.unique(bad))} of {got.size} values differ from the emulator, "
                          f"first at {tuple(int(i) for i in np.unravel_index(bad[0], got.shape))}")


def spin_kernel(cp):
    """A kernel that keeps the GPU busy for ``cycles`` clocks: launch it before a batch of timed
    calls, so the host's enqueue time is hidden behind it."""
    return cp.RawKernel(SPIN_SRC, "hx_bench_spin")


def spin_cycles(cp, seconds: float) -> int:
    """Clocks of ``seconds`` at the device's reported clock rate."""
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    return int(int(props.get("clockRate", 1_500_000)) * 1e3 * seconds)


def device_name(cp, props=None) -> str:
    """The current device's name (from ``props``, its properties, when the caller has them)."""
    props = props or cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    return props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])


def timing_setup(cp, spin_seconds: float = 3e-3):
    """``(props, device name, L2 bytes, spin kernel, spin cycles)`` of the current device: what every
    kernel benchmark sets up before timing (the spin keeps the GPU busy ``spin_seconds`` per batch)."""
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    name = device_name(cp, props)
    l2 = int(props.get("l2CacheSize", 60 * 2**20)) or 60 * 2**20
    return props, name, l2, spin_kernel(cp), spin_cycles(cp, spin_seconds)


def median_event_time(cp, fn, reps, batches, spin, cycles) -> float:
    """Median over batches of (time of ``reps`` calls of fn(i)) / reps, in seconds (CUDA events;
    a spin kernel before each batch hides the host)."""
    times = []
    for _ in range(batches):
        spin((1,), (1,), (np.int64(cycles),))
        start, end = cp.cuda.Event(), cp.cuda.Event()
        start.record()
        for i in range(reps):
            fn(i)
        end.record()
        end.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, end) / 1e3 / reps)
    return statistics.median(times)


def rotating_copies(cp, host_array, l2_bytes: int) -> list:
    """The array on the device, copied until the copies together are at least 4x the L2 size, so
    that calls rotating through them read from DRAM."""
    n_copies = max(1, math.ceil(4 * l2_bytes / host_array.nbytes))
    first = cp.asarray(host_array)
    return [first] + [first.copy() for _ in range(n_copies - 1)]


class Activations:
    """The q8_1 bytes of the first ``wd`` columns of the device activations ``x`` in a kernel's layout
    (``mmq.launch.activation_layout``; cached): what a launch of ``wd`` columns reads. A layout may depend on
    the width (the MMA8 layouts from ``MMA8_MIN_COLS`` columns on), so each width has its own buffer."""

    def __init__(self, cp, x):
        self.cp, self.x, self._made = cp, x, {}

    def __call__(self, wd: int, layout: str | None):
        from hiraishin.kernels import quantize
        from hiraishin.kernels.quantize.launch import output_shape

        key = (wd, layout)
        if key not in self._made:
            # zeros: the MMA8 layouts' padding columns, which the kernels read and drop, are never written
            xq = self.cp.zeros(output_shape(wd, self.x.shape[1], layout), dtype=self.cp.uint8)
            quantize.launch(self.x[:wd], xq, layout)
            self._made[key] = xq
        return self._made[key]


def subblock_case(cp, rng, qtype: str, k: int, n: int, ncols: int, l2_bytes: int, tiles: bool = False):
    """One sub-block mat-vec benchmark case: random ``qtype`` weights (n, k) rotated through copies
    (:func:`rotating_copies`; ``tiles``: in hiraishin.kernels.mmq.wtile's tile records, for launches made with
    ``wtile=True``), ``ncols`` random activation rows on the device and their q8_1 bytes per width
    and layout (:class:`Activations`; call ``acts(wd, launch.layout)``), the rows checked (the first and last
    32 and 64 drawn from ``rng``) and the emulator's outputs for them (the sub-block order: one column's bits
    are every width's). Returns ``(rows, ref, ws, x, acts, weight bytes)``."""
    from hiraishin.kernels import quantize
    from hiraishin.kernels.mmq import emulate as mmq_emulate
    from hiraishin.plans.subblock import subblock_plan
    from hiraishin.quant import random_blocks

    w_host = random_blocks(qtype, n, k, seed=1)
    rows = np.unique(np.concatenate([np.arange(32), np.arange(n - 32, n), rng.choice(n, 64, replace=False)]))
    x_host = rng.standard_normal((ncols, k)).astype(np.float32)
    ref = mmq_emulate(w_host[rows], qtype, quantize.emulate(x_host), subblock_plan(1, qtype, k))
    if tiles:
        from hiraishin.kernels.mmq.wtile import tile_weight

        ws = rotating_copies(cp, tile_weight(w_host, qtype), l2_bytes)
    else:
        ws = rotating_copies(cp, w_host, l2_bytes)
    x = cp.asarray(x_host)
    return rows, ref, ws, x, Activations(cp, x), w_host.nbytes


# Qwen3-8B's mat-vec shapes (reference section 8: hidden 4096, kv heads 8 x 128, ffn 12288,
# vocab 151936) in its Q4_K_M type mix: (label, weight type, K inputs, N rows).
QWEN3_8B_MATVECS = [
    ("attn_q/attn_output 4096->4096", "Q4_K", 4096, 4096),
    ("attn_k/attn_v 4096->1024", "Q4_K", 4096, 1024),
    ("ffn_up/ffn_gate 4096->12288", "Q4_K", 4096, 12288),
    ("ffn_down 12288->4096", "Q6_K", 12288, 4096),
    ("output 4096->151936", "Q6_K", 4096, 151936),
]


def write_rows_json(path, rows: list, **extra) -> None:
    """``{"commit", "date", **extra, "rows"}`` written atomically: the JSON of the replay scripts
    (host_overhead.py, ablate_pass.py, replay_widths.py, sweep_norm.py)."""
    import json
    import time

    from hiraishin.atomic import atomic_write

    out = {"commit": git_commit(), "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **extra, "rows": rows}
    with atomic_write(path) as f:
        json.dump(out, f, indent=1)


def capture_chain(stream, step, steps: int, pdl: bool = True):
    """The CUDA graph of ``step(0) .. step(steps - 1)`` (each enqueues its launches on the current stream),
    captured on ``stream`` (under programmatic dependent launch when ``pdl``) after one uncaptured ``step(0)``
    that compiles and loads the kernels. The chain scripts' one capture (barrier_vs_launch.py,
    proto_inline_norm.py)."""
    from hiraishin.kernels.pdl import pdl_scope

    with stream:
        step(0)
        stream.synchronize()
        stream.begin_capture()
        with pdl_scope(pdl):
            for i in range(steps):
                step(i)
        return stream.end_capture()


def replay_seconds(graph, stream, steps: int, batches: int = 3) -> list:
    """Seconds per launch of a captured CUDA graph, ``steps`` launches back to back per batch (one
    synchronization at each end: the GPU's own time, no host gap between launches)."""
    import time

    per_launch = []
    for _ in range(batches):
        stream.synchronize()
        t0 = time.perf_counter()
        for _ in range(steps):
            graph.launch(stream)
        stream.synchronize()
        per_launch.append((time.perf_counter() - t0) / steps)
    return per_launch
