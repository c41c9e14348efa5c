"""Where the time of one decode step goes on the CUDA backend: GPU time vs host time, per op.

    python bench/profile_decode.py --out DIR [--shape qwen3-0.6b] [--tokens 32]
                                   [--orders batch_invariant,batch_variant] [--modes plain,graphs]
                                   [--workdir DIR]

On a synthetic model (``hiraishin.model.synth.write_synthetic``, real shapes, random blocks), for
each order: prefill a short prompt, warm up, then measure one-token forward passes four ways:

1. ``wall``: time of ``model.forward([token], pos)`` (ends with the logits on the host).
   ``enqueue``: the part of it until the forward hands the logits to the device-to-host copy,
   i.e. the host time of issuing the step (the GPU is idle when a step starts, so a
   synchronizing call inside it, if any, costs little here).
2. ``gpu``: the step's kernels back to back. A spin kernel keeps the GPU busy while the host
   enqueues the step, so CUDA events around the step time kernel execution only. If the GPU
   caught up with the host anyway (spin too short, or a call in the step that waits for the
   stream, such as an upload from pageable host memory), the sample is flagged "caught up" and
   includes idle gaps.
3. per-op host time: every backend op wrapped in ``time.perf_counter`` (the GPU is NOT
   synchronized: this is the time to issue the op), exclusive of nested ops, per token; and the
   kernel launches per token (RawKernels counted at launch; CuPy's own kernels, the KV-cache
   copies and the position ``arange``, added per op).
4. cProfile of the decode steps: top 25 functions by cumulative time.

Each order is profiled in two modes: ``plain`` passes (``cuda_graphs=False``) and ``graphs``
(``Qwen3.cuda_graphs``, on by default on CUDA: a whole pass of 1..16 tokens replayed as one CUDA
graph, ``hiraishin.backends.graphs.PassGraphs``; in that mode the per-op table shows only the ops
launched outside the graphs). Before any timing, the logits of the prompt and 4 greedy steps are
compared bit for bit with the CPU backend (the emulators; ``emulator_bit_identical``), and the
logits of 24 greedy steps in both modes with each other (``graphs_bit_identical``); a mismatch
stops the run (``benchlib.BitMismatch``).

Writes DIR/profile_decode-<shape>.json, DIR/profile_decode-<shape>.md and
DIR/profile_decode-<shape>-<order>.prof (``python -m pstats`` reads them).
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import io
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from benchlib import BitMismatch, git_commit, spin_kernel  # noqa: E402

PROMPT_TOKENS = 16
WARMUP_TOKENS = 4
GPU_SAMPLES = 8
PROFILE_TOKENS = 16
COUNT_TOKENS = 2
N_CTX = 1024
EMULATOR_STEPS = 4
# Unchecked backend ops (``backend.ops``) the forward pass calls, and the ops they call in turn
# (each wrapped for the per-op breakdown; times are exclusive of nested ops).
OPS = ("positions", "get_rows", "rms_norm", "mul_mats", "mul_mat", "quantize", "rope", "store_kv",
       "causal_attention", "flash_attn", "add", "swiglu")
# Backend methods the forward pass calls (the logits' device-to-host copy).
BACKEND_OPS = ("to_host",)
# Kernels an op launches that are not hiraishin RawKernels (CuPy's own): per call.
CUPY_KERNELS_PER_CALL = {"positions": 1}
# The modules whose kernels a decode step launches (their get_kernel is wrapped to count launches).
KERNEL_MODULES = ("mmvq", "quantize", "tiled", "attention", "elementwise", "rmsnorm", "rope")

class _Stepper:
    """One-token forward passes continuing a prompt (greedy; rolls back before the cache fills)."""

    def __init__(self, model, order, prompt):
        self.model, self.order, self.prompt = model, order, prompt
        model.reset()
        self.logits = model.forward(prompt, 0, order=order)[-1]
        self.pos = len(prompt)

    def step(self):
        if self.pos >= self.model.n_ctx:
            self.pos = len(self.prompt)
        token = int(np.argmax(self.logits))
        self.logits = self.model.forward([token], self.pos, order=self.order)[-1]
        self.pos += 1


def _ops_of(backend):
    """The object whose ops the forward pass calls (the unchecked ops, ``backend.ops``)."""
    return backend.ops


class _Patch:
    """Replace attributes of an object for a while, restoring instance attributes or class lookup."""

    def __init__(self, obj, **attrs):
        self.obj, self.attrs = obj, attrs
        self.saved = {name: vars(obj)[name] for name in attrs if name in vars(obj)}

    def __enter__(self):
        for name, value in self.attrs.items():
            setattr(self.obj, name, value)
        return self

    def __exit__(self, *exc):
        for name in self.attrs:
            if name in self.saved:
                setattr(self.obj, name, self.saved[name])
            else:
                delattr(self.obj, name)


class _HostMark:
    """Wraps the forward pass's ``to_host``: remembers when the pass handed over its logits."""

    def __init__(self, backend, on_enter=None):
        self.on_enter, self.t = on_enter, None
        self.orig = backend.to_host  # a backend method: plain passes and graph replays both end with it
        self.patch = _Patch(backend, to_host=self._to_host)

    def _to_host(self, a):
        self.t = time.perf_counter()
        if self.on_enter is not None:
            self.on_enter()
        return self.orig(a)

    def __enter__(self):
        self.patch.__enter__()
        return self

    def __exit__(self, *exc):
        self.patch.__exit__(*exc)


def time_wall(stepper, n):
    wall, enqueue = [], []
    be = stepper.model.backend
    with _HostMark(be) as mark:
        for _ in range(n):
            t0 = time.perf_counter()
            stepper.step()
            t1 = time.perf_counter()
            wall.append(t1 - t0)
            enqueue.append(mark.t - t0)
    return wall, enqueue


def time_gpu(cp, stepper, n, spin_cycles):
    spin = spin_kernel(cp)
    samples, caught_up = [], 0
    be = stepper.model.backend
    for _ in range(n):
        start, end = cp.cuda.Event(), cp.cuda.Event()
        state = {}

        def on_enter():
            end.record()
            state["gpu_idle"] = start.done  # True: the GPU finished the spin before the host finished issuing

        # the step's stream: the default one, or the CUDA-graph stream the replay runs on
        graphs = getattr(stepper.model, "_graphs", None)
        with graphs.stream if graphs is not None else contextlib.nullcontext():
            spin((1,), (1,), (np.int64(spin_cycles),))
            start.record()
            with _HostMark(be, on_enter):
                stepper.step()
        end.synchronize()
        samples.append(cp.cuda.get_elapsed_time(start, end) / 1e3)
        caught_up += bool(state.get("gpu_idle"))
    return samples, caught_up


class _OpTimer:
    """Exclusive host time and calls per op of the forward pass (wrappers shadow the methods)."""

    def __init__(self, backend):
        self.ops = _ops_of(backend)
        self.time = {op: 0.0 for op in OPS + BACKEND_OPS}
        self.calls = {op: 0 for op in OPS + BACKEND_OPS}
        self._stack = []
        missing = [op for op in OPS if not hasattr(self.ops, op)] + [op for op in BACKEND_OPS
                                                                      if not hasattr(backend, op)]
        if missing:
            raise AttributeError(f"the backend has no {missing}: update OPS / BACKEND_OPS")
        self.patches = [_Patch(self.ops, **{op: self._wrap(op, getattr(self.ops, op)) for op in OPS}),
                        _Patch(backend, **{op: self._wrap(op, getattr(backend, op)) for op in BACKEND_OPS})]

    def __enter__(self):
        for p in self.patches:
            p.__enter__()
        return self

    def __exit__(self, *exc):
        for p in self.patches:
            p.__exit__(*exc)

    def _wrap(self, op, fn):
        def timed(*args, **kwargs):
            self._stack.append(0.0)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                dt = time.perf_counter() - t0
                child = self._stack.pop()
                self.time[op] += dt - child
                self.calls[op] += 1
                if self._stack:
                    self._stack[-1] += dt

        return timed


def count_launches(stepper, n) -> dict:
    """RawKernel launches per token by kernel name (handles re-fetched through a counting wrapper)."""
    import importlib

    from hiraishin.kernels import compile as kernels_compile

    # the launch modules (``hiraishin.kernels.<op>.launch``; the package attribute ``launch`` is
    # the op's launch function, so import the modules by name)
    modules = [importlib.import_module(f"hiraishin.kernels.{op}.launch") for op in KERNEL_MODULES]
    counts: dict[str, int] = {}
    real_get_kernel = kernels_compile.get_kernel

    class Counted:
        def __init__(self, name, kernel):
            self.name, self.kernel = name, kernel

        def __call__(self, *args, **kwargs):
            counts[self.name] = counts.get(self.name, 0) + 1
            return self.kernel(*args, **kwargs)

        def __getattr__(self, attr):  # num_regs, local_size_bytes, ...: the kernel's
            return getattr(self.kernel, attr)

    def get_kernel(source_key, name, defines=None, name_expressions=None):
        return Counted(name, real_get_kernel(source_key, name, defines, name_expressions))

    caches = [m._kernel for m in modules if hasattr(m, "_kernel")]  # functools caches of kernel handles
    ops = _ops_of(stepper.model.backend)
    # prepared launches holding kernel handles: the backend's mat-vecs and quantize launches, and
    # the launch modules' own caches they share
    prepared = [getattr(ops, name) for name in ("_matvecs", "_quantize")]
    prepared += [m._launches for m in modules if hasattr(m, "_launches")]

    def forget():  # drop held kernel handles, so that they are fetched again through get_kernel
        for c in caches:
            c.cache_clear()
        for d in prepared:
            d.clear()

    forget()
    saved = [(m, m.get_kernel) for m in modules]  # each module imported get_kernel by name
    for m, _ in saved:
        m.get_kernel = get_kernel
    try:
        for _ in range(n):
            stepper.step()
    finally:
        for m, real in saved:
            m.get_kernel = real
        forget()
    return {k: v / n for k, v in sorted(counts.items())}


def _prompt(model):
    return np.random.default_rng(0).integers(0, model.config.n_vocab, PROMPT_TOKENS).tolist()


def emulator_bit_identical(model, cpu_model, order, n=EMULATOR_STEPS) -> bool:
    """The prompt and ``n`` greedy steps give the CPU backend's logits (the emulators), bit for bit,
    with CUDA graphs off and on."""
    cpu = _Stepper(cpu_model, order, _prompt(model))
    want = [cpu.logits.view(np.uint32).copy()]
    for _ in range(n):
        cpu.step()
        want.append(cpu.logits.view(np.uint32).copy())
    same = True
    for on in (False, True):
        model.cuda_graphs = on
        gpu = _Stepper(model, order, _prompt(model))
        got = [gpu.logits.view(np.uint32).copy()]
        for _ in range(n):
            gpu.step()
            got.append(gpu.logits.view(np.uint32).copy())
        same &= bool(np.array_equal(np.stack(got), np.stack(want)))
    model.cuda_graphs = False
    return same


def graphs_bit_identical(model, order, n=24) -> bool:
    """Greedy steps with and without CUDA graphs give the same logits, bit for bit."""
    runs = []
    for on in (False, True):
        model.cuda_graphs = on
        stepper = _Stepper(model, order, _prompt(model))
        logits = []
        for _ in range(n):
            stepper.step()
            logits.append(stepper.logits.view(np.uint32).copy())
        runs.append(np.stack(logits))
    model.cuda_graphs = False
    return bool(np.array_equal(runs[0], runs[1]))


def profile_order(cp, model, order, n_tokens, spin_cycles_per_ms, out_dir, shape, mode):
    model.cuda_graphs = mode == "graphs"
    stepper = _Stepper(model, order, _prompt(model))
    for _ in range(WARMUP_TOKENS):
        stepper.step()

    wall, enqueue = time_wall(stepper, n_tokens)
    wall_ms = statistics.median(wall) * 1e3
    spin_ms = max(20.0, 3 * wall_ms)
    gpu, caught_up = time_gpu(cp, stepper, GPU_SAMPLES, int(spin_ms * spin_cycles_per_ms))

    timer = _OpTimer(model.backend)
    t0 = time.perf_counter()
    with timer:
        for _ in range(n_tokens):
            stepper.step()
    instrumented = (time.perf_counter() - t0) / n_tokens
    launches = count_launches(stepper, COUNT_TOKENS)

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(PROFILE_TOKENS):
        stepper.step()
    prof.disable()
    prof_path = None
    if out_dir is not None:
        prof_path = out_dir / f"profile_decode-{shape}-{order.name}-{mode}.prof"
        prof.dump_stats(prof_path)
    text = io.StringIO()
    pstats.Stats(prof, stream=text).sort_stats("cumulative").print_stats(25)

    ops = {}
    for op in OPS:
        calls = timer.calls[op] / n_tokens
        if calls:
            us = timer.time[op] / n_tokens * 1e6
            ops[op] = dict(calls_per_token=calls, host_us_per_token=us, host_us_per_call=us / calls,
                           cupy_kernels_per_token=calls * CUPY_KERNELS_PER_CALL.get(op, 0))
    model.cuda_graphs = False
    return dict(
        order=order.name, mode=mode,
        wall_ms_median=wall_ms, wall_ms_all=[t * 1e3 for t in wall],
        enqueue_ms_median=statistics.median(enqueue) * 1e3,
        gpu_ms_median=statistics.median(gpu) * 1e3, gpu_ms_all=[t * 1e3 for t in gpu],
        gpu_samples_caught_up=caught_up, spin_ms=spin_ms,
        instrumented_ms_per_token=instrumented * 1e3,
        ops=ops,
        raw_kernel_launches_per_token=launches,
        # host calls that start GPU work: RawKernel launches, CuPy kernels, and in graphs mode the one
        # graph launch of the whole pass and the two fills of the token and position buffers
        launches_per_token=sum(launches.values()) + sum(o["cupy_kernels_per_token"] for o in ops.values())
        + (3 if mode == "graphs" else 0),
        cprofile_top25=text.getvalue(),
        cprofile_file=str(prof_path) if prof_path else None,
    )


def markdown(meta, rows) -> str:
    lines = [f"# Decode-step profile, {meta['shape']} on {meta['device']} ({meta['date'][:10]}, "
             f"commit {meta['commit']})", "",
             "| order | mode | wall ms/token | host enqueue ms | GPU ms (kernels back to back) | host launch calls/token "
             "| host us/launch | instrumented ms |", "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        flag = f" ({r['gpu_samples_caught_up']} samples caught up)" if r["gpu_samples_caught_up"] else ""
        per_launch = r["enqueue_ms_median"] * 1e3 / max(r["launches_per_token"], 1)
        lines.append(f"| {r['order']} | {r['mode']} | {r['wall_ms_median']:.2f} | {r['enqueue_ms_median']:.2f} | "
                     f"{r['gpu_ms_median']:.3f}{flag} | {r['launches_per_token']:.0f} | {per_launch:.1f} | "
                     f"{r['instrumented_ms_per_token']:.2f} |")
    lines += ["", f"Bit-identical to the CPU emulators (prompt + {EMULATOR_STEPS} greedy steps, graphs off and on): "
              + ", ".join(f"{k} {'yes' if v else 'NO'}" for k, v in meta["emulator_bit_identical"].items()),
              "", "CUDA graphs bit-identical to plain passes (24 greedy steps): " + ", ".join(
                  f"{k} {'yes' if v else 'NO'}" for k, v in meta["graphs_bit_identical"].items())]
    for r in rows:
        lines += ["", f"## {r['order']}, {r['mode']}: host time per op (exclusive, GPU not synchronized)", "",
                  "| op | calls/token | us/token | us/call |", "|---|---|---|---|"]
        for op, o in sorted(r["ops"].items(), key=lambda kv: -kv[1]["host_us_per_token"]):
            lines.append(f"| {op} | {o['calls_per_token']:.0f} | {o['host_us_per_token']:.0f} | "
                         f"{o['host_us_per_call']:.1f} |")
        lines += ["", "RawKernel launches per token: " + ", ".join(
            f"{k} {v:.0f}" for k, v in r["raw_kernel_launches_per_token"].items()), "",
            "<details><summary>cProfile, top 25 by cumulative time</summary>", "", "```",
            r["cprofile_top25"].strip(), "```", "</details>"]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--out", help="directory for the .json/.md report and the .prof files")
    parser.add_argument("--shape", default="qwen3-0.6b", help="synthetic shape (hiraishin.model.synth)")
    parser.add_argument("--tokens", type=int, default=32, help="decode steps per measurement (default 32)")
    parser.add_argument("--orders", default="batch_invariant,batch_variant")
    parser.add_argument("--modes", default="plain,graphs", help="plain and/or graphs (CUDA-graph replay)")
    parser.add_argument("--workdir", default=None, help="where the synthetic file goes (default: a temp dir)")
    args = parser.parse_args(argv)

    import cupy as cp

    from hiraishin.model.qwen3 import Qwen3
    from hiraishin.model.synth import write_synthetic
    from hiraishin.order import ReductionOrder

    orders = {o.name: o for o in (ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT,
                                  ReductionOrder.FIXED_SPLIT)}
    props = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
    device = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    spin_cycles_per_ms = float(props.get("clockRate", 2_000_000))  # kHz = cycles per ms
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="hiraishin-profile-"))
    path = workdir / f"{args.shape}.gguf"
    if not path.exists():
        write_synthetic(path, shape=args.shape, seed=0, progress=False)
    model = Qwen3.from_gguf(path, device="cuda", n_ctx=N_CTX, progress=False)
    cpu_model = Qwen3.from_gguf(path, device="cpu", n_ctx=PROMPT_TOKENS + EMULATOR_STEPS + 1, progress=False)
    commit = git_commit()
    print(f"commit {commit}", flush=True)
    out_dir = Path(args.out) if args.out else None
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)

    rows, identical, emulated = [], {}, {}
    modes = [m for m in args.modes.split(",") if m]
    for name in [s for s in args.orders.split(",") if s]:
        # the bits first: no timing of kernels that disagree with their emulators
        emulated[name] = emulator_bit_identical(model, cpu_model, orders[name])
        if not emulated[name]:
            raise BitMismatch(f"{args.shape} {name}: GPU logits differ from the CPU backend's (emulators)")
        if "graphs" in modes:
            identical[name] = graphs_bit_identical(model, orders[name])
            if not identical[name]:
                raise BitMismatch(f"{args.shape} {name}: CUDA-graph passes differ from plain passes")
        for mode in modes:
            row = profile_order(cp, model, orders[name], args.tokens, spin_cycles_per_ms, out_dir, args.shape, mode)
            rows.append(row)
            print(json.dumps({k: v for k, v in row.items() if k not in ("cprofile_top25", "wall_ms_all")},
                             indent=1), flush=True)
    meta = dict(device=device, shape=args.shape, date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                commit=commit, command=" ".join([sys.executable] + sys.argv), cupy=cp.__version__,
                python=sys.version.split()[0], emulator_bit_identical=emulated, graphs_bit_identical=identical)
    text = markdown(meta, rows)
    print(text)
    if out_dir is not None:
        (out_dir / f"profile_decode-{args.shape}.json").write_text(json.dumps(dict(meta, rows=rows), indent=1))
        (out_dir / f"profile_decode-{args.shape}.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
