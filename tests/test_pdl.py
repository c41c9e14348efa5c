"""Programmatic dependent launch: which kernels may start early, and what they do before waiting.

A kernel launched with PDL may run while the previous kernel still writes its inputs, so every
kernel of the package must wait (``HX_PDL_ENTRY``) before it reads or writes anything another
kernel touches. These CPU tests check the sources; the GPU tests (tests/test_engine_gpu.py)
check that graphs captured with PDL give the bits of eager passes.
"""

from __future__ import annotations

import ctypes
import re
from importlib import resources

import numpy as np
import pytest

from hiraishin.errors import BackendError
from hiraishin.kernels import pdl

KERNEL_DIR = resources.files("hiraishin.kernels")


def _sources():
    for folder in sorted(KERNEL_DIR.iterdir(), key=lambda p: p.name):
        if folder.is_dir():
            for f in sorted(folder.iterdir(), key=lambda p: p.name):
                if f.name.endswith(".cu"):
                    yield f"{folder.name}/{f.name}", f.read_text(encoding="utf-8")


# extern "C" __global__ void [__launch_bounds__(...)] name(
_SIGNATURE = re.compile(r"__global__\s+void\s+(?:__launch_bounds__\([^)]*\)\s*)?(\w+)\s*\(")


def _kernels(source: str):
    """(name, body) of every __global__ function (a macro's too, under its parameter's name)."""
    for m in _SIGNATURE.finditer(source):
        start = source.index("{", m.end())
        depth = 0
        for i in range(start, len(source)):
            depth += {"{": 1, "}": -1}.get(source[i], 0)
            if depth == 0:
                yield m.group(1), source[start + 1:i]
                break


# Kernels launched beside the pass, never in its chain and never with PDL: they touch only weights
# (which no kernel writes) and write nothing, so they need no wait.
SIDE_KERNELS = {"hx_l2_ahead"}
FOUND = [(path, name, body) for path, src in _sources() for name, body in _kernels(src)]
ALL = [k for k in FOUND if k[1] not in SIDE_KERNELS]
SIDE = [k for k in FOUND if k[1] in SIDE_KERNELS]


def test_every_kernel_is_found():
    assert len(ALL) >= 15, [n for _, n, _ in ALL]
    assert {n for _, n, _ in SIDE} == SIDE_KERNELS


@pytest.mark.parametrize("path,name,body", SIDE, ids=[f"{p}:{n}" for p, n, _ in SIDE])
def test_side_kernels_store_nothing_and_never_launch_early(path, name, body):
    source = KERNEL_DIR.joinpath(*path.split("/")).read_text(encoding="utf-8")
    assert "HX_PDL_ENTRY" not in body and not pdl.body_has_entry(source, name)
    # every pointer it is given is const (so it cannot store through one), and it has no other memory
    params = re.search(r"\b" + name + r"\s*\(([^)]*)\)", source).group(1).split(",")
    assert all("const" in p for p in params if "*" in p), params
    for token in ("__shared__", "__syncthreads", "atomic", "st.global", "const_cast", "(unsigned char*)"):
        assert token not in body, f"{path}: side kernel {name} uses {token!r}"


# Reads of written memory before the wait, each sound by an argument its kernel states, named here so that no
# other slips in: fattn_vec_q1_rope's FV_CACHE_EARLY block loads KV-cache cells that only kernels two or more
# back wrote, which have finished once PDL lets a kernel's dependents launch only after its own wait
# (fused/launch.py attn_early_build builds it only then: tests/test_fattn_rope.py).
EARLY_READS = {("attention/fattn_vec.cu", "fattn_vec_q1_rope"): re.compile(r"#if FV_CACHE_EARLY\n.*?#endif\n", re.S)}


@pytest.mark.parametrize("path,name,body", ALL, ids=[f"{p}:{n}" for p, n, _ in ALL])
def test_kernel_waits_before_touching_shared_memory(path, name, body):
    assert "HX_PDL_ENTRY" in body, f"{path}: kernel {name} has no HX_PDL_ENTRY()"
    assert pdl.body_has_entry(KERNEL_DIR.joinpath(*path.split("/")).read_text(encoding="utf-8"), name)
    before = body.split("HX_PDL_ENTRY", 1)[0]
    if (path, name) in EARLY_READS:
        block = EARLY_READS[(path, name)].search(before)
        assert block, f"{path}: kernel {name}'s named early reads are gone: drop its EARLY_READS entry"
        for token in ("__shared__", "__syncthreads", "atomic", "K[", "V[", "->", "st.global"):  # loads only
            assert token not in block.group(0), f"{path}: kernel {name}'s early reads use {token!r}"
        before = before.replace(block.group(0), "")
    # Before the wait only weight prefetches and copies (read-only bytes; a copy into the block's own shared
    # memory, test_the_weight_copy_reads_weights_only) and index arithmetic may run: no array access, no store to
    # global memory, no barrier.
    before = re.sub(r"hx_prefetch_(rows|lines)\([^;]*\);", "", before)
    before = re.sub(r"\bws = hx_dp4a_wcopy\([^;]*\);", "", before)
    for token in ("[", "__shared__", "__syncthreads", "->", "atomic"):
        assert token not in before, f"{path}: kernel {name} uses {token!r} before HX_PDL_ENTRY"


def test_body_has_entry_edge_cases():
    src = """
    extern "C" __global__ void a(int* x) { if (1) { x[0] = 1; } }
    extern "C" __global__ void __launch_bounds__(128, 1)
    b(int* x) { HX_PDL_ENTRY(); { x[0] = 2; } }
    #define K(name) extern "C" __global__ void name(int* x) { HX_PDL_ENTRY(); }
    K(c)
    #define KK(T, NAME)                                   \\
        extern "C" __global__ void NAME(T* x) {           \\
            if (1) { HX_PDL_ENTRY(); }                    \\
        }
    KK(float, d)
    #define NO_WAIT(NAME) extern "C" __global__ void NAME(int* x) { x[0] = 3; }
    NO_WAIT(e)
    extern "C" __global__ void f(int* x);
    extern "C" __global__ void g(int* x) { HX_PDL_ENTRY(); }
    extern "C" __global__ void f(int* x) { x[0] = 4; }
    """
    assert not pdl.body_has_entry(src, "a")
    assert pdl.body_has_entry(src, "b")
    assert pdl.body_has_entry(src, "c")  # made by a macro: its kernel's body counts
    assert pdl.body_has_entry(src, "d")  # over continued lines, the name as the second argument
    assert not pdl.body_has_entry(src, "e")  # a macro whose kernel does not wait
    assert not pdl.body_has_entry(src, "float")  # an argument that is not the kernel's name
    assert not pdl.body_has_entry(src, "missing")
    assert not pdl.body_has_entry(src, "f")  # its declaration has no body: not g's body, its own definition's


class _FakeDevicePtr:
    def __init__(self, ptr):
        self.ptr = ptr


class _FakeArray:
    def __init__(self, ptr):
        self.data = _FakeDevicePtr(ptr)


def test_argument_bytes_match_what_a_plain_launch_passes():
    def raw(c):
        return bytes(ctypes.string_at(ctypes.addressof(c), ctypes.sizeof(c)))

    assert raw(pdl._ctype(_FakeArray(0x1234))) == (0x1234).to_bytes(8, "little")
    assert raw(pdl._ctype(np.float32(1.5))) == np.float32(1.5).tobytes()
    assert raw(pdl._ctype(np.int32(-7))) == np.int32(-7).tobytes()
    assert raw(pdl._ctype(np.uint64(0))) == bytes(8)
    assert raw(pdl._ctype(np.int64(1 << 40))) == np.int64(1 << 40).tobytes()
    assert raw(pdl._ctype(-3))[:4] == np.int32(-3).tobytes()  # an int parameter reads the low 4 bytes
    with pytest.raises(BackendError, match="cannot pass a str"):
        pdl._ctype("x")


def test_launch_structs_have_the_driver_layout():
    # cuda.h: CUlaunchAttribute is 72 bytes (id, pad, 64-byte union); CUlaunchConfig 56 bytes
    assert ctypes.sizeof(pdl._LaunchAttribute) == 72
    assert pdl._LaunchConfig.hStream.offset == 32
    assert pdl._LaunchConfig.attrs.offset == 40
    assert pdl._LaunchConfig.numAttrs.offset == 48


def test_scope_is_off_without_a_capable_device(monkeypatch):
    monkeypatch.setattr(pdl, "_SUPPORTED", False)
    with pdl.pdl_scope() as on:
        assert on is False and not pdl.pdl_enabled()
    assert not pdl.pdl_enabled()


def test_scope_nests_and_restores(monkeypatch):
    monkeypatch.setattr(pdl, "_SUPPORTED", True)
    assert not pdl.pdl_enabled()
    with pdl.pdl_scope():
        assert pdl.pdl_enabled()
        with pdl.pdl_scope(False):
            assert not pdl.pdl_enabled()
        assert pdl.pdl_enabled()
    assert not pdl.pdl_enabled()


def test_trigger_defines_follow_the_environment(monkeypatch):
    monkeypatch.delenv(pdl.ENV_PDL_TRIGGER, raising=False)
    assert pdl.trigger_defines() == {"HX_PDL_EARLY": 0}
    monkeypatch.setenv(pdl.ENV_PDL_TRIGGER, "early")
    assert pdl.trigger_defines() == {"HX_PDL_EARLY": 1}
    monkeypatch.setenv(pdl.ENV_PDL_TRIGGER, "after_wait")
    assert pdl.trigger_defines() == {"HX_PDL_EARLY": 0}
    monkeypatch.setenv(pdl.ENV_PDL_TRIGGER, "soon")
    with pytest.raises(BackendError, match="HIRAISHIN_PDL_TRIGGER.*'soon'"):
        pdl.trigger_defines()


def test_every_source_gets_the_trigger_define(monkeypatch):
    from hiraishin.kernels.compile import load_source

    monkeypatch.setenv(pdl.ENV_PDL_TRIGGER, "early")
    assert "#define HX_PDL_EARLY 1" in load_source("mmvq/mmvq.cu")
    monkeypatch.delenv(pdl.ENV_PDL_TRIGGER)
    assert "#define HX_PDL_EARLY 0" in load_source("mmvq/mmvq.cu")


def test_the_weight_copy_reads_weights_only():
    """onecol_dp4a.cu's hx_dp4a_wcopy, which its kernels call before the PDL wait: it reads through its weight pointer
    ``w`` only and writes through ``dst`` (into its own __shared__ array) only, with no barrier."""
    src = KERNEL_DIR.joinpath("mmq", "onecol_dp4a.cu").read_text(encoding="utf-8")
    start = src.index("hx_dp4a_wcopy(const unsigned char* __restrict__ w")
    body = src[src.index("{", start):src.index("\n}\n", start)]
    assert re.search(r"__shared__ __align__\(16\) unsigned char ws\[", body)
    assert "unsigned char* dst = ws + mis;" in body
    copies = re.findall(r"hx_cp_async16\(([^,]+),\s*([^;]+)\);", body)
    assert copies and all(d.strip().startswith("dst +") and g.strip().startswith("w +") for d, g in copies)
    loads = re.findall(r"\*\((const [^)]*\*)\)\(([^;]*?)\);", body)
    assert loads and all(kind.startswith("const ") and expr.strip().startswith("w +") for kind, expr in loads)
    stores = re.findall(r"\*\((unsigned [^)]*\*)\)\(([^)]*)\) =", body)
    assert stores and all(expr.strip().startswith("dst +") for _, expr in stores)
    for token in ("__syncthreads", "atomic", "st.global", "->", "out"):
        assert token not in body, token
