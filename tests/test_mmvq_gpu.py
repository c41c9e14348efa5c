"""GPU: the mat-vec, tiled and q8_1 kernels equal their emulators bit for bit; invariance holds.

Run on the GPU machine (``pytest -m gpu tests/test_mmvq_gpu.py``). With
``HIRAISHIN_RESULTS_DIR`` set, the register counts of the compiled kernels are
written to ``$HIRAISHIN_RESULTS_DIR/mmvq_kernels.json``.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest

from hiraishin.backends import get_backend
from hiraishin.kernels import mmvq, tiled
from hiraishin.kernels.compile import precompile as precompile_modules
from hiraishin.kernels.mmvq.launch import mmvq_kernel, precompile, preset_kernel_defines
from hiraishin.kernels.quantize.launch import quantize_kernel
from hiraishin.kernels.quantize.layout import to_layout
from hiraishin.kernels.tiled.launch import tiled_defines
from hiraishin.order import ReductionOrder
from hiraishin.plans import MatVecPlan, matvec_plan
from hiraishin.plans.matvec import TILE_ROWS, TILE_THREADS
from hiraishin.quant import random_blocks as random_weights

pytestmark = pytest.mark.gpu

QTYPES = ["Q4_K", "Q6_K", "Q8_0"]
N_ROWS = 67  # odd: partial CUDA blocks for every rows_per_block and a partial tile
K_OF = {"Q4_K": 2560, "Q6_K": 2560, "Q8_0": 1312}  # 10 super-blocks; 41 Q8_0 blocks (short last tile step)


@pytest.fixture(scope="module")
def cp():
    import cupy

    return cupy


def quantize_q8_1(x, backend="cpu", layout=None):
    return get_backend(backend).quantize_q8_1(x, layout)


def mul_mat(w, qtype, x, order, backend):
    return get_backend(backend).mul_mat(w, qtype, x, order)


def mul_mat_vec(w, qtype, xq, plan, backend):
    return get_backend(backend).mul_mat_q8_1(w, qtype, xq, plan)


def emulate_mmvq(w, qtype, xq, nwarps):
    plan = MatVecPlan("mmvq", qtype, nwarps=nwarps, rows_per_block=1, cols_per_launch=1, ncols=xq.shape[0])
    return mmvq.emulate(w, qtype, xq, plan)


def _tiled_plan(qtype, ncols):
    return MatVecPlan("tiled", qtype, nwarps=TILE_THREADS // 32, rows_per_block=TILE_ROWS, cols_per_launch=ncols,
                      ncols=ncols)


def _bits(a):
    return np.ascontiguousarray(a).view(np.uint32)


def _activations(seed, ncols, k):
    rng = np.random.default_rng(seed)
    x = (rng.standard_normal((ncols, k)) * rng.uniform(0.1, 4.0, size=(ncols, 1))).astype(np.float32)
    x[0, :32] = 0.0
    return x


def _data(qtype, ncols=16, seed=0):
    k = K_OF[qtype]
    w = random_weights(qtype, N_ROWS, k, seed=seed)
    x = _activations(seed + 1, ncols, k)
    return w, x, quantize_q8_1(x)


def test_q8_1_kernel_equals_emulator(cp):
    x = _activations(3, 23, 4096)
    x[5] *= 1e4
    x[6] *= 1e-6
    got = cp.asnumpy(quantize_q8_1(cp.asarray(x), "cuda"))
    np.testing.assert_array_equal(got, quantize_q8_1(x, "cpu"))
    for layout in ("Q4_K", "Q6_K"):  # the mat-vec layouts, written by the kernel and converted
        got = cp.asnumpy(quantize_q8_1(cp.asarray(x), "cuda", layout))
        np.testing.assert_array_equal(got, to_layout(quantize_q8_1(x, "cpu"), layout), err_msg=layout)
        np.testing.assert_array_equal(cp.asnumpy(to_layout(cp.asarray(quantize_q8_1(x, "cpu")), layout)), got)


@pytest.mark.parametrize("qtype", QTYPES)
def test_mmvq_kernel_equals_emulator_all_geometries(cp, qtype):
    w, x, xq = _data(qtype, seed=QTYPES.index(qtype))
    wg, xqg = cp.asarray(w), cp.asarray(xq)
    custom = ReductionOrder.custom
    precompile(qtype, K_OF[qtype],
               [matvec_plan(custom(nwarps=nwarps, rows_per_block=rows), width, qtype)
                for nwarps in (1, 2, 3, 4, 8) for rows in (1, 2, 4) for width in range(1, 17)]
               + [matvec_plan(custom(nwarps=nwarps, max_cols_per_launch=16), width, qtype)
                  for nwarps in (1, 2, 3, 4, 8) for width in (11, 16)])
    for nwarps in (1, 2, 3, 4, 8):
        emu = emulate_mmvq(w, qtype, xq, nwarps)
        for rows in (1, 2, 4):
            order = ReductionOrder.custom(nwarps=nwarps, rows_per_block=rows)
            for width in range(1, 17):
                plan = matvec_plan(order, width, qtype)
                got = cp.asnumpy(mul_mat_vec(wg, qtype, xqg[:width], plan, "cuda"))
                np.testing.assert_array_equal(_bits(got), _bits(emu[:width]),
                                              err_msg=f"nwarps={nwarps} rows={rows} width={width}")
        # up to 16 columns in one launch
        wide = ReductionOrder.custom(nwarps=nwarps, max_cols_per_launch=16)
        for width in (11, 16):
            plan = matvec_plan(wide, width, qtype)
            assert len(plan.launches()) == 1
            got = cp.asnumpy(mul_mat_vec(wg, qtype, xqg[:width], plan, "cuda"))
            np.testing.assert_array_equal(_bits(got), _bits(emu[:width]))


@pytest.mark.parametrize("qtype", QTYPES)
def test_mmvq_narrow_load_path_equals_emulator(cp, qtype):
    # A weight that starts 4 (Q4_K) or 2 bytes into its buffer takes the kernels' narrow-load
    # path (Q4_K's 16-byte and Q6_K's 4-byte loads need aligned blocks); same bits.
    w, x, xq = _data(qtype, seed=7)
    shift = 4 if qtype == "Q4_K" else 2
    buf = cp.zeros(w.nbytes + 16, dtype=cp.uint8)
    wg = buf[shift:shift + w.nbytes].reshape(w.shape)
    wg[...] = cp.asarray(w)
    assert wg.data.ptr % 16 == shift
    xqg = cp.asarray(xq)
    for nwarps in (2, 4):
        emu = emulate_mmvq(w, qtype, xq, nwarps)
        for rows in (1, 2):
            order = ReductionOrder.custom(nwarps=nwarps, rows_per_block=rows)
            for width in (1, 3, 8):
                got = cp.asnumpy(mul_mat_vec(wg, qtype, xqg[:width], matvec_plan(order, width, qtype), "cuda"))
                np.testing.assert_array_equal(_bits(got), _bits(emu[:width]),
                                              err_msg=f"nwarps={nwarps} rows={rows} width={width}")


@pytest.mark.parametrize("qtype", QTYPES)
def test_tiled_kernel_equals_emulator(cp, qtype):
    w, x, xq = _data(qtype, ncols=40, seed=10)
    emu = tiled.emulate(w, qtype, xq)
    wg, xqg = cp.asarray(w), cp.asarray(xq)
    for width in (1, 9, 16, 17, 33, 40):
        out = cp.empty((width, N_ROWS), dtype=cp.float32)
        tiled.launch(wg, qtype, xqg[:width], _tiled_plan(qtype, width), out)
        np.testing.assert_array_equal(_bits(cp.asnumpy(out)), _bits(emu[:width]), err_msg=f"width={width}")


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("order", [ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT],
                         ids=["variant", "invariant"])
def test_orders_gpu_equal_cpu(cp, qtype, order):
    w, x, _ = _data(qtype, seed=20)
    wg, xg = cp.asarray(w), cp.asarray(x)
    for width in range(1, 17):
        cpu = mul_mat(w, qtype, x[:width], order, "cpu")
        gpu = cp.asnumpy(mul_mat(wg, qtype, xg[:width], order, "cuda"))
        np.testing.assert_array_equal(_bits(gpu), _bits(cpu), err_msg=f"{order.name} width={width}")


@pytest.mark.parametrize("qtype", QTYPES)
def test_invariance_and_variance_on_gpu(cp, qtype):
    k = 4096 if qtype != "Q6_K" else 12288
    w = cp.asarray(random_weights(qtype, 256, k, seed=30))
    x = cp.asarray(_activations(31, 16, k))
    inv, var = ReductionOrder.BATCH_INVARIANT, ReductionOrder.BATCH_VARIANT
    alone = [cp.asnumpy(mul_mat(w, qtype, x[j:j + 1], inv, "cuda"))[0] for j in range(16)]
    for b in range(1, 17):
        batch = cp.asnumpy(mul_mat(w, qtype, x[:b], inv, "cuda"))
        for j in range(b):
            np.testing.assert_array_equal(_bits(batch[j]), _bits(alone[j]), err_msg=f"b={b} j={j}")
    first = [cp.asnumpy(mul_mat(w, qtype, x[:b], var, "cuda"))[0] for b in range(1, 17)]
    assert all(np.array_equal(_bits(first[b - 1]), _bits(alone[0])) for b in (1, 2, 3, 4))
    assert all(not np.array_equal(_bits(first[b - 1]), _bits(alone[0])) for b in range(5, 17))


@pytest.mark.parametrize("qtype, n, k", [("Q4_K", 4096, 4096), ("Q6_K", 1024, 12288)])
def test_qwen_shapes_equal_emulator(cp, qtype, n, k):
    w = random_weights(qtype, n, k, seed=40)
    x = _activations(41, 9, k)
    wg, xg = cp.asarray(w), cp.asarray(x)
    for order in (ReductionOrder.BATCH_VARIANT, ReductionOrder.BATCH_INVARIANT):
        for width in (1, 5, 9):
            cpu = mul_mat(w, qtype, x[:width], order, "cpu")
            gpu = cp.asnumpy(mul_mat(wg, qtype, xg[:width], order, "cuda"))
            np.testing.assert_array_equal(_bits(gpu), _bits(cpu))


def test_no_spills_and_record_registers(cp):
    from hiraishin.kernels.compile import get_kernel, kernel_attributes

    records = {}
    kernels = [(f"quantize_q8_1 layout={layout}", quantize_kernel(layout)) for layout in (None, "Q4_K", "Q6_K")]
    for qtype in QTYPES:
        kernels.append((f"mmq_tiled {qtype}", get_kernel("tiled/mmq_tiled.cu", "mmq_tiled", tiled_defines(qtype))))
        # Every launch the presets make for 1..16 columns, at the Qwen3-8B row lengths.
        jobs = {**preset_kernel_defines(qtype, 4096), **preset_kernel_defines(qtype, 12288)}
        precompile_modules(("mmvq/mmvq.cu", d) for d in jobs.values())
        for name, d in jobs.items():
            kernel, used = mmvq_kernel(d)
            kernels.append((f"{name} min_blocks={used['HX_MIN_BLOCKS']}", kernel))
    for name, kernel in kernels:
        attrs = kernel_attributes(kernel)
        records[name] = attrs
        assert attrs["local_size_bytes"] == 0, (name, attrs)
    out_dir = os.environ.get("HIRAISHIN_RESULTS_DIR")
    if out_dir:
        os.makedirs(out_dir, exist_ok=True)
        dev = cp.cuda.runtime.getDeviceProperties(cp.cuda.Device().id)
        name = dev["name"].decode() if isinstance(dev["name"], bytes) else str(dev["name"])
        with open(os.path.join(out_dir, "mmvq_kernels.json"), "w") as f:
            json.dump({"device": name, "kernels": records}, f, indent=1, sort_keys=True)
