"""Draft GGUFs derived from a target: seeded noise, same quant types, optional layer cut."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGUFReader

from hiraishin.decode.draft import write_draft
from hiraishin.errors import GGUFError
from hiraishin.quant import dequantize, qtype_name


def _tensors(path):
    return {t.name: (qtype_name(t.tensor_type), np.array(t.data)) for t in GGUFReader(path).tensors}


def _fields(path):
    return {f.name: f.contents() for f in GGUFReader(path).fields.values() if not f.name.startswith("GGUF.")}


def test_zero_noise_copies_the_target(micro_model_path, tmp_path):
    out = write_draft(micro_model_path, tmp_path / "d0.gguf", noise=0.0)
    a, b = _tensors(micro_model_path), _tensors(out)
    assert list(a) == list(b)
    for name in a:
        assert a[name][0] == b[name][0]
        assert a[name][1].tobytes() == b[name][1].tobytes(), name
    assert _fields(out) == _fields(micro_model_path)


def test_noise_moves_every_tensor_by_about_its_fraction_of_the_std(micro_model_path, tmp_path):
    out = write_draft(micro_model_path, tmp_path / "d.gguf", noise=0.05, seed=3)
    a, b = _tensors(micro_model_path), _tensors(out)
    assert list(a) == list(b)
    for name, (qtype, data) in a.items():
        assert b[name][0] == qtype and b[name][1].shape == data.shape, name
        x, y = dequantize(data, qtype).astype(np.float64), dequantize(b[name][1], qtype).astype(np.float64)
        assert not np.array_equal(x, y), name
        if x.size >= 4096:  # the requantization error adds to the noise; both are small
            rel = np.std(y - x) / np.std(x)
            assert 0.02 < rel < 0.25, (name, rel)
    again = write_draft(micro_model_path, tmp_path / "d2.gguf", noise=0.05, seed=3)
    assert (tmp_path / "d.gguf").read_bytes() == again.read_bytes()
    other = write_draft(micro_model_path, tmp_path / "d3.gguf", noise=0.05, seed=4)
    assert (tmp_path / "d.gguf").read_bytes() != other.read_bytes()


def test_n_layer_keeps_the_first_layers(micro_model_path, tmp_path):
    from hiraishin.model.gguf_file import open_qwen3_gguf

    full = open_qwen3_gguf(micro_model_path).config
    out = write_draft(micro_model_path, tmp_path / "d1.gguf", noise=0.0, n_layer=1)
    cut = open_qwen3_gguf(out).config
    assert cut.n_layer == 1 and full.n_layer > 1
    assert cut.n_embd == full.n_embd and cut.n_vocab == full.n_vocab
    names = list(_tensors(out))
    assert not any(n.startswith("blk.1.") for n in names)
    assert any(n.startswith("blk.0.") for n in names)


def test_bad_arguments_name_the_input(micro_model_path, tmp_path):
    with pytest.raises(GGUFError, match="n_layer"):
        write_draft(micro_model_path, tmp_path / "x.gguf", n_layer=0)
    with pytest.raises(GGUFError, match="n_layer"):
        write_draft(micro_model_path, tmp_path / "x.gguf", n_layer=99)
    with pytest.raises(GGUFError, match="noise"):
        write_draft(micro_model_path, tmp_path / "x.gguf", noise=-1)
    junk = tmp_path / "junk.gguf"
    junk.write_bytes(b"not a gguf at all")
    with pytest.raises(GGUFError, match="junk.gguf"):
        write_draft(junk, tmp_path / "x.gguf")
