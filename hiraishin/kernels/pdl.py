"""Programmatic dependent launch (PDL) for the kernels of a captured pass.

A CUDA graph of a decode step is a chain of a few hundred small kernels; between two of them the
GPU drains one grid, flushes its writes and only then launches the next grid's blocks (about 1.5
to 2 microseconds a node on an H200, measured: ``bench/results``). Launched with
``CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION`` a kernel's blocks may start while the
previous kernel still runs; each waits in ``HX_PDL_ENTRY()`` (``fp.cuh``: ``griddepcontrol.wait``)
until every earlier grid has finished and its writes are visible, so what it reads and the float
operations it performs are those of a plain launch: the bits cannot change, only the gaps.
Mat-vec kernels ask L2 for their weight rows before that wait (weights are never written).

CuPy's ``RawKernel`` launches through ``cuLaunchKernel``, which takes no launch attributes, so a
PDL launch goes to the driver's ``cuLaunchKernelEx`` through ctypes. That costs a few
microseconds of host time per launch, paid once per captured graph: :func:`pdl_scope` turns PDL
launches on only around a graph capture (``hiraishin.backends.graphs``). A kernel is launched
this way only when its body names ``HX_PDL_ENTRY`` (:func:`body_has_entry`; every kernel of the
package does, ``tests/test_pdl.py``), and only on a device of compute capability 9.0 or later.
``HIRAISHIN_PDL=0`` turns it off.

Where a kernel lets its successor launch is ``HIRAISHIN_PDL_TRIGGER``: ``after_wait`` (the default:
``griddepcontrol.wait`` then ``launch_dependents``) or ``early`` (``launch_dependents`` first, so
the next kernel's blocks become resident while this one still waits): :func:`trigger_defines`,
which every compiled source gets. Scheduling either way; the bits are the same. On the H200
``early`` gained nothing (Qwen3-8B one- and three-token passes within 1%, the 0.6B's SUBBLOCK pass
16% slower; bench/results/2026-12-02-h200-session5/b-norm-pdl), so ``after_wait`` stays the default.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import re
import threading

import numpy as np

from ..errors import BackendError
from ..switches import env_flag

__all__ = ["ENV_PDL", "ENV_PDL_TRIGGER", "PDL_TRIGGERS", "trigger_defines", "PDL_MIN_CC", "PdlKernel", "body_has_entry", "pdl_enabled", "pdl_scope", "pdl_supported"]

ENV_PDL = "HIRAISHIN_PDL"
ENV_PDL_TRIGGER = "HIRAISHIN_PDL_TRIGGER"
PDL_TRIGGERS = ("after_wait", "early")
PDL_MIN_CC = 90  # griddepcontrol is PTX ISA 7.8, sm_90 and later
# cuda.h: CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION = 6
_ATTR_PROGRAMMATIC_STREAM_SERIALIZATION = 6


class _LaunchAttribute(ctypes.Structure):
    # cuda.h CUlaunchAttribute_st: a 4-byte id, padding to 8, a 64-byte value union.
    _fields_ = [("id", ctypes.c_uint32), ("pad", ctypes.c_char * 4), ("value", ctypes.c_ubyte * 64)]


class _LaunchConfig(ctypes.Structure):
    # cuda.h CUlaunchConfig_st, field order as declared there.
    _fields_ = [("gridDimX", ctypes.c_uint), ("gridDimY", ctypes.c_uint), ("gridDimZ", ctypes.c_uint),
                ("blockDimX", ctypes.c_uint), ("blockDimY", ctypes.c_uint), ("blockDimZ", ctypes.c_uint),
                ("sharedMemBytes", ctypes.c_uint), ("hStream", ctypes.c_void_p),
                ("attrs", ctypes.POINTER(_LaunchAttribute)), ("numAttrs", ctypes.c_uint)]


_state = threading.local()  # .on: PDL launches wanted on this thread (inside pdl_scope)
_driver = None


def _launch_ex():
    global _driver
    if _driver is None:
        try:
            lib = ctypes.CDLL("libcuda.so.1")
            fn = lib.cuLaunchKernelEx
        except (OSError, AttributeError) as exc:
            raise BackendError(f"programmatic dependent launch needs cuLaunchKernelEx from libcuda: {exc}") from exc
        fn.restype = ctypes.c_int
        fn.argtypes = [ctypes.POINTER(_LaunchConfig), ctypes.c_void_p, ctypes.POINTER(ctypes.c_void_p),
                       ctypes.c_void_p]
        _driver = fn
    return _driver


_SUPPORTED: bool | None = None


def trigger_defines() -> dict:
    """``{"HX_PDL_EARLY": 0 or 1}`` from ``HIRAISHIN_PDL_TRIGGER`` (fp.cuh's HX_PDL_ENTRY)."""
    value = os.environ.get(ENV_PDL_TRIGGER, PDL_TRIGGERS[0]).strip() or PDL_TRIGGERS[0]
    if value not in PDL_TRIGGERS:
        raise BackendError(f"{ENV_PDL_TRIGGER} must be one of {', '.join(PDL_TRIGGERS)}, got {value!r}")
    return {"HX_PDL_EARLY": int(value == "early")}


def pdl_supported() -> bool:
    """True when PDL is not turned off (``HIRAISHIN_PDL=0``) and the current device is sm_90+."""
    global _SUPPORTED
    if _SUPPORTED is None:
        if not env_flag(ENV_PDL, True, "programmatic dependent launch"):
            _SUPPORTED = False
        else:
            import cupy

            _SUPPORTED = int(cupy.cuda.Device().compute_capability) >= PDL_MIN_CC  # "90" on an H200
    return _SUPPORTED


def pdl_enabled() -> bool:
    """True inside :func:`pdl_scope` on a device that supports PDL."""
    return getattr(_state, "on", False)


@contextlib.contextmanager
def pdl_scope(enabled: bool = True):
    """Launch kernels with programmatic stream serialization while the block runs (this thread)."""
    before = getattr(_state, "on", False)
    _state.on = bool(enabled) and pdl_supported()
    try:
        yield _state.on
    finally:
        _state.on = before


def body_has_entry(source: str, name: str) -> bool:
    """True when the ``__global__`` function ``name`` in ``source`` names ``HX_PDL_ENTRY`` in its body.

    A kernel a function-like macro makes (``#define K(NAME, ...) ... __global__ void NAME(...) {...}``, then
    ``K(name, ...)``) is found through the macro: the argument in NAME's place is ``name``, and the macro's
    kernel body is what counts. Anything else (a name found nowhere, a macro whose kernel does not wait) is
    False: never launched early, the safe answer.
    """
    base = name.split("<", 1)[0]
    body = _kernel_body(source, base)
    if body is not None:
        return "HX_PDL_ENTRY" in body
    for macro, params, text in _function_macros(source):
        for call in re.finditer(r"(?<![\w#])" + re.escape(macro) + r"\s*\(([^()]*)\)", source):
            args = [a.strip() for a in call.group(1).split(",")]
            if len(args) == len(params) and base in args:
                body = _kernel_body(text, params[args.index(base)])
                if body is not None and "HX_PDL_ENTRY" in body:
                    return True
    return False


def _kernel_body(source: str, name: str) -> str | None:
    """The body of the ``__global__`` function ``name`` in ``source`` (None: none; a declaration, whose
    parameter list ends in ``;``, has no body and is passed over)."""
    for m in re.finditer(r"__global__[^;{]*?\b" + re.escape(name) + r"\s*\(", source):
        start = source.find("{", m.end())
        if start >= 0 and ";" not in source[m.end():start]:
            return _braced(source, start)
    return None


def _braced(source: str, start: int) -> str | None:
    """``source[start:i]`` up to the brace that closes the one at ``start`` (None: it never closes)."""
    depth = 0
    for i in range(start, len(source)):
        c = source[i]
        if c == "{":
            depth += 1
        elif c == "}":
            depth -= 1
            if depth == 0:
                return source[start:i]
    return None


def _function_macros(source: str):
    """``(name, parameters, replacement text)`` of each function-like ``#define`` in ``source`` (continued
    lines joined)."""
    for m in re.finditer(r"^[ \t]*#[ \t]*define[ \t]+(\w+)\(([^)]*)\)((?:[^\n]*\\\n)*[^\n]*)", source, re.M):
        yield m.group(1), [p.strip() for p in m.group(2).split(",")], m.group(3).replace("\\\n", "\n")


def _ctype(arg):
    # The driver reads each parameter's own size from the kernel image, as for CuPy's launches: a
    # Python int goes as 8 bytes (its low bytes for a 4-byte int, little-endian), a float as a double.
    if hasattr(arg, "data") and hasattr(arg.data, "ptr"):
        return ctypes.c_void_p(arg.data.ptr)
    if isinstance(arg, np.generic):
        return (ctypes.c_ubyte * arg.nbytes).from_buffer_copy(arg.tobytes())
    if isinstance(arg, bool):
        return ctypes.c_bool(arg)
    if isinstance(arg, int):
        return ctypes.c_int64(arg)
    if isinstance(arg, float):
        return ctypes.c_double(arg)
    raise BackendError(f"cannot pass a {type(arg).__name__} to a kernel launch")


class PdlKernel:
    """A ``cupy.RawKernel`` that launches with PDL inside :func:`pdl_scope` when its body allows it.

    Called like the RawKernel (``kernel(grid, block, args, shared_mem=0)``); every other
    attribute is the RawKernel's.
    """

    __slots__ = ("pdl", "raw")

    def __init__(self, raw, pdl: bool):
        self.raw = raw
        self.pdl = pdl

    def __getattr__(self, name):
        return getattr(self.raw, name)

    def __call__(self, grid, block, args, shared_mem=0, **kwargs):
        if not (self.pdl and getattr(_state, "on", False)) or kwargs:
            return self.raw(grid, block, args, shared_mem=shared_mem, **kwargs)
        import cupy

        grid = tuple(grid) + (1,) * (3 - len(grid))
        block = tuple(block) + (1,) * (3 - len(block))
        values = [_ctype(a) for a in args]
        params = (ctypes.c_void_p * max(len(values), 1))()
        for i, v in enumerate(values):
            params[i] = ctypes.cast(ctypes.byref(v), ctypes.c_void_p)
        attr = _LaunchAttribute()
        attr.id = _ATTR_PROGRAMMATIC_STREAM_SERIALIZATION
        attr.value[0] = 1  # programmaticStreamSerializationAllowed (an int, little-endian)
        cfg = _LaunchConfig(int(grid[0]), int(grid[1]), int(grid[2]), int(block[0]), int(block[1]),
                            int(block[2]), int(shared_mem), cupy.cuda.get_current_stream().ptr,
                            ctypes.pointer(attr), 1)
        rc = _launch_ex()(ctypes.byref(cfg), self.raw.kernel.ptr, params, None)
        if rc != 0:
            raise BackendError(f"cuLaunchKernelEx of {self.raw.name!r} failed with CUresult {rc}")
