"""Independent check: the synthetic `tiny` GGUF loaded by Hugging Face transformers' GGUF loader.

transformers dequantizes the file with gguf-py and runs its own Qwen3 implementation in float32,
so it checks our float64 reference and our emulated kernels against code we did not write.
Needs torch and transformers (not dependencies of hiraishin): skipped when they are missing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

pytestmark = pytest.mark.slow
torch = pytest.importorskip("torch")  # at import: a missing dependency skips before any fixture is built
transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")  # transformers needs it to load a GGUF file

# Expected agreement: transformers (float32) vs our float64 reference: float32 rounding only.
REFERENCE_MAX_REL_ERR = 1e-3
# Our emulated kernels (q8_1 activations, f16 KV cache) vs transformers: as vs the reference.
KERNELS_MAX_REL_ERR = 0.05
KERNELS_MIN_TOP1 = 0.85


def test_transformers_gguf_loader_agrees(tiny_model_path):
    from hiraishin.model.qwen3 import Qwen3
    from hiraishin.model.reference import ReferenceQwen3

    path = Path(tiny_model_path)
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name,
                                                          dtype=torch.float32)
    hf.eval()
    tokens = np.random.default_rng(5).integers(0, 151643, 24).tolist()
    with torch.no_grad():
        theirs = hf(torch.tensor([tokens])).logits[0].double().numpy()
    ref = ReferenceQwen3(path).forward(tokens)
    ours = Qwen3.from_gguf(path, device="cpu", n_ctx=64, progress=False).forward(tokens, 0)
    scale = np.abs(theirs).max()
    assert np.abs(ref - theirs).max() / scale < REFERENCE_MAX_REL_ERR
    assert np.abs(ours - theirs).max() / scale < KERNELS_MAX_REL_ERR
    assert (ours.argmax(1) == theirs.argmax(1)).mean() >= KERNELS_MIN_TOP1
