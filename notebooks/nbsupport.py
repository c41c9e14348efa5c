"""What the six notebooks share: bit views, the model they run, kernel source excerpts, timers.

Imported by every notebook (``notebooks/`` is the notebooks' working directory, and the test adds
it to ``PYTHONPATH``). Nothing here computes a result a notebook claims; it only fetches, prints
and times.

The model: ``$HIRAISHIN_MODEL`` when it is set (a real Qwen3 GGUF shows the real thing), else a
seeded synthetic Qwen3 written once into ``$HIRAISHIN_CACHE`` (default ``~/.cache/hiraishin``).
Its shape is chosen so that every mechanism the notebooks talk about shows on it:

* rows of 1024 and 3072 inputs, i.e. 4 and 12 super-blocks of 256: a row needs more than 2 (Q6_K)
  or 4 (Q4_K) super-blocks for 4 warps and 2 warps to sum it differently (notebook 02);
* 2 query heads sharing 1 KV head: on the H200 profile the one-query attention plan regroups the
  KV chunks a query sees at 1280 cells, so the 256-cell guard has something to guard (notebook 04);
* 2 layers and a 4,096-token vocabulary: a token costs about 0.1 s on two CPU cores.
"""

from __future__ import annotations

import contextlib
import importlib
import importlib.resources
import inspect
import json
import os
import resource
import time
from pathlib import Path

import numpy as np

MODEL_ENV = "HIRAISHIN_MODEL"
CACHE_ENV = "HIRAISHIN_CACHE"
SYNTH_SEED = 0
# A noisy draft: the target's weights plus seeded noise of this fraction of each tensor's std,
# requantized. Enough to be rejected now and then, little enough to be accepted mostly.
DRAFT_NOISE = 0.01
# The checkout these notebooks live in (bench/results/ is read from there).
REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "bench" / "results"  # the committed GPU results of this checkout


def committed_results(name: str):
    """(date it records, path, data) of every committed result file called ``name`` under ``bench/results/``."""
    for f in sorted(RESULTS.rglob(name)):
        data = json.loads(f.read_text())
        yield str(data.get("meta", data).get("date", "")), f, data


# The package whose files the excerpts come from.
_PACKAGE = "hiraishin"


# ------------------------------------------------------------------------------------------ bits


def bits(a) -> np.ndarray:
    """float32 values as their uint32 bit patterns (equal bits <=> the same float, -0.0 and NaNs apart)."""
    return np.ascontiguousarray(a, dtype=np.float32).view(np.uint32)


def ordered(a) -> np.ndarray:
    """float32 bit patterns mapped to int64 in the order of the floats: adjacent floats differ by 1."""
    i = np.ascontiguousarray(a, dtype=np.float32).view(np.int32).astype(np.int64)
    return np.where(i < 0, -(i & 0x7FFFFFFF), i)


def ulps(a, b) -> np.ndarray:
    """Signed distance from ``b`` to ``a`` in float32 units in the last place."""
    return ordered(a) - ordered(b)


def hexbits(x) -> str:
    """One float32 as ``0x3f800000``."""
    return f"{int(np.float32(x).view(np.uint32)):#010x}"


# ----------------------------------------------------------------------------------------- model


def notebook_shape():
    """The synthetic shape the notebooks default to (see the module docstring)."""
    from hiraishin.model.synth import MICRO_MATRIX_STD, SynthShape

    # The micro shape's stronger layers (MICRO_MATRIX_STD) keep a 2-layer tied model from
    # repeating one token; its top-2 logits come close often, where reduction order flips tokens.
    return SynthShape("notebook", n_embd=1024, n_layer=2, n_head=2, n_head_kv=1, n_ff=3072,
                      vocab="micro", tied=True, fill="gaussian", matrix_std=MICRO_MATRIX_STD)


def cache_dir() -> Path:
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "hiraishin"


def _cached_file(path: Path, write) -> Path:
    """``path``, written first by ``write(tmp)`` if missing; renamed into place only when complete."""
    if path.exists():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


def synthetic_path() -> Path:
    """The cached synthetic model: written on first use (about 10 s), verified on every use."""
    from hiraishin.model.synth import cached_model

    return cached_model(notebook_shape(), seed=SYNTH_SEED, cache_dir=cache_dir())


def model_path() -> Path:
    """``$HIRAISHIN_MODEL`` if set, else the cached synthetic model."""
    env = os.environ.get(MODEL_ENV)
    if env:
        path = Path(env).expanduser()
        if not path.exists():
            raise FileNotFoundError(f"${MODEL_ENV} = {env!r} does not exist")
        return path
    return synthetic_path()


def _write_draft(target, out) -> None:
    from hiraishin.decode.draft import write_draft

    write_draft(target, out, noise=DRAFT_NOISE, seed=SYNTH_SEED + 1)


def draft_path(target) -> Path:
    """A noisy draft of ``target``: from the synthetic cache for the synthetic model, else beside it."""
    from hiraishin.model.synth import cached_model

    target = Path(target)
    if target == synthetic_path():
        return cached_model(notebook_shape(), seed=SYNTH_SEED, cache_dir=cache_dir(), noise=DRAFT_NOISE,
                            draft_writer=_write_draft)
    name = f"{target.stem}-draft-noise{DRAFT_NOISE:g}-{target.stat().st_size}.gguf"
    return _cached_file(cache_dir() / name, lambda p: _write_draft(target, p))


def load_model(path=None, n_ctx: int = 512, device: str = "auto"):
    """``Qwen3.from_gguf`` with the notebooks' defaults: the GPU if there is one, else the CPU emulator."""
    from hiraishin import Qwen3

    return Qwen3.from_gguf(path or model_path(), device=device, n_ctx=n_ctx, progress=False)


# ----------------------------------------------------------------------------------- source code


def kernel_file(op: str, filename: str):
    """A file of the op folder ``hiraishin/kernels/<op>/`` (``op=""``: ``hiraishin/kernels/`` itself).

    The ``.cu`` files ship as package data, so this works from an installed package too.
    """
    package = f"{_PACKAGE}.kernels" + (f".{op}" if op else "")
    return importlib.resources.files(package) / filename


def emulator_module(op: str):
    """The module ``hiraishin.kernels.<op>.emulate`` (the package itself exports a function ``emulate``)."""
    return importlib.import_module(f"{_PACKAGE}.kernels.{op}.emulate")


def excerpt(text: str, marker: str, before: int = 0, after: int = 8, first_line: int = 1) -> tuple[int, str]:
    """The lines around the first line containing ``marker``: (number of the first shown line, text).

    Found by a marker, not by line numbers, so that edits of the file do not break the notebook.
    """
    lines = text.splitlines()
    hits = [i for i, line in enumerate(lines) if marker in line]
    if not hits:
        raise LookupError(f"marker {marker!r} not found")
    lo = max(0, hits[0] - before)
    hi = min(len(lines), hits[0] + after + 1)
    return first_line + lo, "\n".join(lines[lo:hi])


def _show(where: str, start: int, text: str) -> None:
    width = len(str(start + text.count("\n")))
    print(f"── {where}")
    for n, line in enumerate(text.splitlines(), start):
        print(f"{n:>{width}} │ {line}")
    print()


def show_source(op: str, filename: str, marker: str, before: int = 0, after: int = 8) -> None:
    """Print the lines of ``hiraishin/kernels/<op>/<filename>`` around ``marker``, numbered."""
    start, text = excerpt(kernel_file(op, filename).read_text(), marker, before, after)
    _show(f"hiraishin/kernels/{op + '/' if op else ''}{filename}", start, text)


def show_file(package: str, filename: str, marker: str, before: int = 0, after: int = 8) -> None:
    """Print the lines of a file of ``package`` (e.g. ``"hiraishin.plans"``, ``"matvec.py"``) around ``marker``."""
    start, text = excerpt((importlib.resources.files(package) / filename).read_text(), marker, before, after)
    _show(f"{package.replace('.', '/')}/{filename}", start, text)


def show_function(fn, marker: str | None = None, before: int = 0, after: int = 12) -> None:
    """Print the source of ``fn`` (a Numba dispatcher too), or only the lines around ``marker``."""
    py = getattr(fn, "py_func", fn)
    source_lines, first = inspect.getsourcelines(py)
    text = "".join(source_lines).rstrip("\n")
    module = inspect.getmodule(py).__name__.replace(".", "/") + ".py"
    if marker is None:
        _show(f"{module}: {py.__name__}", first, text)
        return
    start, part = excerpt(text, marker, before, after, first_line=first)
    _show(f"{module}: {py.__name__}", start, part)


# ---------------------------------------------------------------------------------------- timing


def cpu_seconds() -> float:
    """CPU time this process has used so far, all threads (user + system)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class Stopwatch:
    """Wall and CPU time of named phases: ``with clock("jit"): ...``; ``clock["jit"]`` is the wall seconds.

    Both are printed because a shared machine stretches wall time: the CPU seconds say what the work
    itself cost (the emulators use every core, so CPU time can exceed wall time).
    """

    def __init__(self):
        self.seconds: dict[str, float] = {}
        self.cpu: dict[str, float] = {}

    @contextlib.contextmanager
    def __call__(self, name: str, quiet: bool = False):
        t0, c0 = time.perf_counter(), cpu_seconds()
        try:
            yield
        finally:
            self.seconds[name] = self.seconds.get(name, 0.0) + time.perf_counter() - t0
            self.cpu[name] = self.cpu.get(name, 0.0) + cpu_seconds() - c0
            if not quiet:
                print(f"[{name}: {self.seconds[name]:.1f} s wall, {self.cpu[name]:.1f} s CPU]")

    def __getitem__(self, name: str) -> float:
        return self.seconds[name]

    def summary(self) -> str:
        """One line: every phase's wall seconds, and the CPU seconds of the whole kernel process."""
        phases = ", ".join(f"{k} {v:.1f} s" for k, v in self.seconds.items())
        return f"{phases}; process CPU {cpu_seconds():.1f} s"


def warm_up(model, orders, widths=(1, 2, 5, 9)) -> float:
    """Compile every kernel path the notebook will take, on throwaway passes; returns the seconds.

    On the CPU this is Numba compiling the emulators (cached on disk after the first run, so a
    second run of the notebook only loads them); on a GPU it is NVRTC compiling the CUDA kernels.
    Widths 1, 2-4, 5-8 and 9+ reach the different mat-vec geometries and both attention kernels.
    """
    t0 = time.perf_counter()
    for order in orders:
        pos = 0
        for n in widths:
            model.forward([1] * n, pos, order=order)
            pos += n
    model.reset()
    return time.perf_counter() - t0


def device_name(backend) -> str:
    """What the backend runs on, in words."""
    if backend.name == "cuda":
        import cupy

        props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
        name = props["name"]
        return name.decode() if isinstance(name, bytes) else str(name)
    return f"CPU (Numba emulator, {os.cpu_count()} cores)"
