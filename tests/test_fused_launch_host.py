"""The fused norm launches' host side (no GPU): the kernel each builds, its grid and block, and the arguments in
the order of the kernel's parameters (fused.cu, embed_norm.cu), with a stand-in for the compiled kernel."""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin.kernels.fused import launch as fused_launch


@pytest.fixture
def built(monkeypatch):
    made = []

    class Kernel:
        def __init__(self, name, source):
            self.name, self.source, self.calls = name, source, []

        def __call__(self, grid, block, args):
            self.calls.append((grid, block, args))

    def fake(name, layout=None, layout2=None, norm_n=None, source=fused_launch.SOURCE):
        made.append(Kernel(name, source))
        return made[-1]

    monkeypatch.setattr(fused_launch, "fused_kernel", fake)
    return made


@pytest.mark.parametrize("n", [1024, 4096])
def test_norm_launches_pass_their_kernels_parameters_in_order(built, n):
    grid = (fused_launch.norm_slices(n), 3, 1)
    block = (fused_launch.norm_geometry(n)[0], 1, 1)
    tail = (np.int32(n), np.float32(1e-6))
    null = fused_launch.NULL

    fused_launch.RmsNormQ8_1Launch(3, n, 1e-6, "Q4_K")("x", "w", "q", None, "q2")
    fused_launch.AddRmsNormQ8_1Launch(3, n, 1e-6, "Q4_K")("a", "b", "w", "s", "q", "y")
    fused_launch.EmbedRmsNormQ8_1Launch("Q6_K", 210, 3, n, 1e-6)("t", "ids", "w", "rows", "q")
    want = [("hx_rms_norm_q8_1", ("x", "w", "q", null, "q2")),
            ("hx_add_rms_norm_q8_1", ("a", "b", "w", "s", "q", "y", null)),
            (fused_launch.EMBED_NORM_KERNELS["Q6_K"], ("t", "ids", np.int64(210), "w", "rows", "q", null, null))]
    for kernel, (name, args) in zip(built, want):
        assert kernel.name == name and len(kernel.calls) == 1
        got_grid, got_block, got_args = kernel.calls[0]
        assert got_grid == grid and got_block == block and got_args == args + tail
    assert built[2].source == fused_launch.SOURCE_EMBED and built[0].source == fused_launch.SOURCE


def test_a_norm_launch_of_no_rows_launches_nothing(built):
    launch = fused_launch.RmsNormQ8_1Launch(0, 1024, 1e-6)
    assert launch("x", "w", "q") == "q" and built[0].calls == []
