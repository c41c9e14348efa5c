"""Opening a GGUF maps its tensors instead of reading them: memory does not grow with the file."""

from __future__ import annotations

import gc
import os
import tracemalloc

import numpy as np
import pytest

from hiraishin.model.gguf_file import open_qwen3_gguf
from hiraishin.model.synth import SynthShape, write_synthetic

# ~150 MB of weights, a small vocabulary: the file is nearly all tensor data.
MID = SynthShape("mid", n_embd=1024, n_layer=8, n_head=8, n_head_kv=4, n_ff=8192, vocab="micro", tied=False,
                 fill="random")


@pytest.fixture(scope="module")
def mid_model_path(tmp_path_factory):
    return write_synthetic(tmp_path_factory.mktemp("mid") / "mid.gguf", shape=MID, seed=0, progress=False)


def resident_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


@pytest.mark.skipif(not os.path.exists("/proc/self/statm"), reason="needs /proc (Linux)")
def test_open_does_not_read_tensor_data(mid_model_path):
    size = os.path.getsize(mid_model_path)
    assert size > 100e6
    gc.collect()
    rss_before = resident_bytes()
    tracemalloc.start()
    try:
        m = open_qwen3_gguf(mid_model_path)
        shapes = [t.data.shape for t in m.tensors.values()]  # touch the views, not the bytes
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    grown = resident_bytes() - rss_before
    assert len(shapes) == len(m.config.tensor_shapes())
    assert peak < 0.05 * size, f"python allocations peaked at {peak} bytes for a {size}-byte file"
    assert grown < 0.1 * size, f"resident memory grew by {grown} bytes for a {size}-byte file"
    gate = m.tensor("blk.2.ffn_gate.weight")
    assert isinstance(gate.data, np.memmap) and not gate.data.flags.owndata
    assert (gate.qtype, gate.data.shape) == ("Q4_K", (8192, 1024 // 256 * 144))
