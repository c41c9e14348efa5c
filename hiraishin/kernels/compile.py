"""Compile and cache the library's CUDA sources with CuPy (NVRTC).

Every op folder (``hiraishin/kernels/<op>/``) ships its CUDA C as a ``.cu`` file beside its
launcher and emulator (package data). Sources are named by their path under
``hiraishin/kernels`` (``"mmvq/mmvq.cu"``). :func:`load_source` reads them with
importlib.resources and prepends ``fp.cuh`` (NVRTC has no include path into the package), and
:func:`get_kernel` compiles the text with ``#define``\\ s for the geometry in front, once per
(source, defines, name expressions), into a ``cupy.RawModule``.

Compile options: C++17 and IEEE arithmetic. We never pass ``-use_fast_math``
and we also turn FMA contraction off (``--fmad=false``): the kernels write
every rounding-relevant operation as ``__fmaf_rn``/``__fmul_rn``/``__fadd_rn``
already, and with contraction off a plain ``a*b+c`` that slipped through would
still round like the Numba emulator (which never contracts) instead of
silently fusing.

CuPy is imported lazily: the package (and its CPU emulators) work without it.
"""

from __future__ import annotations

import functools
import os
import threading
from importlib import resources
from typing import Iterable, Mapping

from ..errors import BackendError
from ..switches import whole_number
from .pdl import PdlKernel, body_has_entry, trigger_defines

__all__ = [
    "BLOCKS_PER_SM",
    "REGISTERS_PER_SM",
    "THREADS_PER_SM",
    "blocks_for_register_cap",
    "relax_register_cap",
    "NVRTC_OPTIONS",
    "cupy_available",
    "require_cupy",
    "load_source",
    "defines_text",
    "format_defines",
    "get_kernel",
    "precompile",
    "kernel_attributes",
    "clear_cache",
    "env_counts",
]

# Per-SM limits of the GPUs we compile for (sm_80 .. sm_90): registers, threads, resident blocks.
REGISTERS_PER_SM = 65536
THREADS_PER_SM = 2048
BLOCKS_PER_SM = 32


def blocks_for_register_cap(regs: int | None, threads: int) -> int:
    """``__launch_bounds__``' minimum resident blocks per SM that caps a ``threads``-thread block at
    ``regs`` registers per thread (1, no cap, for None): the HX_MIN_BLOCKS of the kernels."""
    if regs is None:
        return 1
    return max(1, min(REGISTERS_PER_SM // (threads * regs), THREADS_PER_SM // threads, BLOCKS_PER_SM))


def relax_register_cap(defines: dict, compile_spills):
    """``compile_spills(defines) -> (compiled, spill bytes)`` at the cap of ``defines`` (HX_MIN_BLOCKS), then
    with one resident block fewer (more registers) while it spills, down to no cap; returns
    ``(compiled, defines it was compiled with)``: the register-capped kernels (``mmq``, ``mmq_stock``) on the
    device and ``bench/regs_mmq.py`` with nvcc, one rule for all."""
    min_blocks = defines["HX_MIN_BLOCKS"]
    while True:
        at = dict(defines, HX_MIN_BLOCKS=min_blocks)
        compiled, spills = compile_spills(at)
        if min_blocks == 1 or spills == 0:
            return compiled, at
        min_blocks -= 1


# IEEE float semantics (these are NVRTC's defaults except --fmad; spelled out so a
# reader does not have to know the defaults).
NVRTC_OPTIONS: tuple[str, ...] = (
    "--std=c++17",
    "--fmad=false",
    "--ftz=false",
    "--prec-div=true",
    "--prec-sqrt=true",
)

# Header every source gets in front of it.
_PRELUDE = "fp.cuh"


@functools.lru_cache(maxsize=1)
def cupy_available() -> bool:
    """True when CuPy imports and sees at least one CUDA device."""
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


_cupy_module = None  # set once CuPy has imported and shown a device (require_cupy's fast path)


def require_cupy():
    """Return the ``cupy`` module, or raise :class:`BackendError` saying what is missing.

    The first success is remembered: launchers call this on every launch, and asking the driver
    for the device count each time would cost a runtime call per kernel.
    """
    global _cupy_module
    if _cupy_module is not None:
        return _cupy_module
    try:
        import cupy
    except ImportError as exc:
        raise BackendError(
            "the 'cuda' backend needs CuPy (pip install 'hiraishin[cuda12]' or '[cuda13]'); "
            f"import failed: {exc}"
        ) from exc
    try:
        count = cupy.cuda.runtime.getDeviceCount()
    except Exception as exc:  # CUDA driver missing or broken
        raise BackendError(f"CuPy is installed but no CUDA driver/device is usable: {exc}") from exc
    if count < 1:
        raise BackendError("CuPy is installed but sees no CUDA device")
    _cupy_module = cupy
    return cupy


@functools.lru_cache(maxsize=None)
def _read(name: str) -> str:
    try:
        return resources.files("hiraishin.kernels").joinpath(*name.split("/")).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise BackendError(f"CUDA source {name!r} is not in the hiraishin.kernels package data") from None


@functools.lru_cache(maxsize=1)
def format_defines() -> dict:
    """Block-format facts every source gets as ``#define``\\ s, computed from :mod:`hiraishin.quant`.

    ggml type ids (``HX_Q4_K`` ...), values per block (``HX_QK_K``, ``HX_QK8_0``) and bytes per block
    (``HX_Q4_K_BYTES`` ...): the CUDA sources repeat no table of their own.
    """
    from ..quant import BLOCK_BYTES, BLOCK_ELEMS, GGML_TYPE_ID

    out = {}
    for qtype in ("Q4_K", "Q6_K", "Q8_0", "Q8_1"):
        out[f"HX_{qtype}"] = GGML_TYPE_ID[qtype]
        out[f"HX_{qtype}_BYTES"] = BLOCK_BYTES[qtype]
    out["HX_QK_K"] = BLOCK_ELEMS["Q4_K"]
    out["HX_QK8_0"] = BLOCK_ELEMS["Q8_0"]
    out["HX_QK8_1"] = BLOCK_ELEMS["Q8_1"]
    return out


def load_source(*names: str) -> str:
    """The block-format and PDL-trigger defines, ``fp.cuh``, then the named ``.cu``/``.cuh`` files of this package."""
    parts = [defines_text({**format_defines(), **trigger_defines()}) + _read(_PRELUDE)]
    for name in names:
        if name == _PRELUDE:
            continue
        parts.append(f"// ---- {name} ----\n{_read(name)}")
    return "\n".join(parts)


def defines_text(defines: Mapping[str, object]) -> str:
    """``#define NAME VALUE`` lines (sorted) for ``defines``; what :func:`get_module` prepends."""
    lines = []
    for key, value in sorted(defines.items()):
        if not key.isidentifier():
            raise BackendError(f"bad #define name {key!r}")
        lines.append(f"#define {key} {value}")
    return "\n".join(lines) + ("\n" if lines else "")


_modules: dict = {}
_lock = threading.Lock()


def _source_names(source_key: str | Iterable[str]) -> tuple[str, ...]:
    if isinstance(source_key, str):
        return (source_key,)
    return tuple(source_key)


def _module_key(names: tuple, defines: Mapping[str, object], exprs) -> tuple:
    return names, tuple(sorted((k, str(v)) for k, v in defines.items())), exprs


def get_module(source_key: str | Iterable[str], defines: Mapping[str, object] | None = None,
               name_expressions: Iterable[str] | None = None):
    """The compiled ``cupy.RawModule`` for these sources and defines (cached)."""
    cupy = require_cupy()
    names = _source_names(source_key)
    defines = dict(defines or {})
    exprs = tuple(name_expressions) if name_expressions else None
    key = _module_key(names, defines, exprs)
    with _lock:
        mod = _modules.get(key)
    if mod is None:
        # Compiled outside the lock: NVRTC runs without the GIL, so threads (see precompile)
        # compile different modules at the same time. Two threads asking for the same module
        # both compile it; the first stored wins.
        code = defines_text(defines) + load_source(*names)
        try:
            mod = cupy.RawModule(code=code, options=NVRTC_OPTIONS, backend="nvrtc",
                                 name_expressions=exprs)
            mod.compile()
        except Exception as exc:
            raise BackendError(
                f"compiling {'+'.join(names)} with defines {defines} failed: {exc}"
            ) from exc
        with _lock:
            mod = _modules.setdefault(key, mod)
    return mod


def precompile(jobs: Iterable[tuple], max_workers: int | None = None) -> int:
    """Compile many ``(source_key, defines)`` modules at once on a thread pool; returns how many.

    For code that is about to launch many kernel variants (a test sweeping geometries, a model
    compiling its mat-vecs): NVRTC releases the GIL, so the compiles run side by side instead
    of one after the other. Modules already compiled are skipped.
    """
    from concurrent.futures import ThreadPoolExecutor

    require_cupy()
    todo = {}
    for source_key, defines in jobs:
        names = _source_names(source_key)
        todo[_module_key(names, defines or {}, None)] = (names, defines)
    with _lock:
        todo = [job for key, job in todo.items() if key not in _modules]
    if not todo:
        return 0
    workers = max_workers or min(len(todo), os.cpu_count() or 1)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for _ in pool.map(lambda job: get_module(*job), todo):
            pass
    return len(todo)


# (sources, name, defines, name expressions) -> RawKernel. CuPy's RawModule.get_function builds a
# new RawKernel (and asks the driver for the function) on every call; launchers ask per launch.
_kernels: dict = {}


def get_kernel(source_key: str | Iterable[str], name: str, defines: Mapping[str, object] | None = None,
               name_expressions: Iterable[str] | None = None):
    """The kernel ``name`` from ``source_key`` compiled with ``defines``: a ``cupy.RawKernel``
    wrapped in :class:`~hiraishin.kernels.pdl.PdlKernel` (called the same way; inside
    :func:`~hiraishin.kernels.pdl.pdl_scope` it launches with programmatic dependent launch).

    ``source_key`` is one source path (``"mmvq/mmvq.cu"``) or several, concatenated
    after ``fp.cuh``. ``defines`` become ``#define`` lines in front of the
    source; compiled modules are cached per (sources, defines, name expressions),
    and the kernel objects per (sources, name, defines, name expressions), so a
    repeated call is one dictionary lookup.
    For templated kernels give the instantiation in ``name_expressions`` and
    ask for it by the same ``name``.
    """
    key = (source_key if type(source_key) is str else tuple(source_key), name,
           tuple(sorted(defines.items())) if defines else (),
           tuple(name_expressions) if name_expressions else None)
    kernel = _kernels.get(key)
    if kernel is not None:
        return kernel
    mod = get_module(source_key, defines, name_expressions)
    try:
        kernel = PdlKernel(mod.get_function(name), body_has_entry(load_source(*_source_names(source_key)), name))
    except Exception as exc:
        raise BackendError(f"kernel {name!r} not found in {source_key!r}: {exc}") from exc
    with _lock:
        return _kernels.setdefault(key, kernel)


def kernel_attributes(kernel) -> dict:
    """Compiled facts of a ``cupy.RawKernel``: registers, spills, shared memory.

    ``local_size_bytes`` is the per-thread local memory, which for our kernels
    (no local arrays indexed at run time) means register spills.
    """
    return {
        "num_regs": int(kernel.num_regs),
        "local_size_bytes": int(kernel.local_size_bytes),
        "shared_size_bytes": int(kernel.shared_size_bytes),
        "max_threads_per_block": int(kernel.max_threads_per_block),
    }


def clear_cache() -> None:
    """Forget compiled modules and kernel objects (tests; the on-disk CuPy cache is untouched).

    Kernel handles a launcher already holds stay valid (each keeps its module loaded).
    """
    with _lock:
        _modules.clear()
        _kernels.clear()


def env_counts(env: str, names: tuple, usage: str, text: str | None = None) -> dict:
    """``{name: whole number}`` for the leading ``names`` that the environment variable ``env`` (or ``text``)
    gives colon-separated (``"1:1024:4"``); ``{}`` when unset. A switch with several numbers (a fusion's
    tokens, CUDA blocks, groups) reads itself with this; ``usage`` (e.g. ``"T[:B[:G[:S]]]"``) goes into the
    error that names ``env`` and the bad text."""
    text = (os.environ.get(env, "") if text is None else text).strip()
    if not text:
        return {}
    parts = text.split(":")
    values = [whole_number(part) for part in parts]
    if len(parts) > len(names) or None in values:
        raise BackendError(f"{env} must be {usage} (whole numbers), got {text!r}")
    return dict(zip(names, values))
