"""Greedy decoding (hiraishin.decode.greedy) and the ``hiraishin generate`` command, on `micro` (CPU)."""

from __future__ import annotations

import numpy as np
import pytest

from hiraishin.decode.greedy import GenerationResult, Step, top_k_of
from hiraishin.errors import HiraishinError
from hiraishin.model.qwen3 import Qwen3
from hiraishin.order import ReductionOrder

PROMPT = "Once upon a time"
N_NEW = 6


@pytest.fixture(scope="module")
def model(micro_model_path):
    return Qwen3.from_gguf(micro_model_path, device="cpu", n_ctx=64, progress=False)


@pytest.fixture(scope="module")
def plain(model):
    return model.generate(PROMPT, max_new_tokens=N_NEW, stop_at_eos=False, top_k=4)


def test_generate_stops_at_max_tokens_with_top_k_and_timings(model, plain):
    assert isinstance(plain, GenerationResult)
    assert plain.prompt_tokens == model.tokenizer.encode(PROMPT)
    assert len(plain.tokens) == N_NEW and plain.stop_reason == "max_tokens"
    assert plain.top_k_ids.shape == (N_NEW, 4) and plain.top_k_logits.shape == (N_NEW, 4)
    assert plain.top_k_ids[:, 0].tolist() == plain.tokens
    assert np.all(np.diff(plain.top_k_logits, axis=1) <= 0)
    assert plain.text == model.tokenizer.decode(plain.tokens)
    assert plain.prefill_s > 0 and len(plain.step_s) == N_NEW - 1 and plain.order == "batch_invariant"


def test_generated_tokens_are_the_argmax_of_one_pass_over_the_sequence(model, plain):
    # under the invariant order, one pass over prompt + generated tokens gives the same argmaxes
    seq = plain.prompt_tokens + plain.tokens
    model.reset()
    logits = model.forward(seq[:-1], 0, order=ReductionOrder.BATCH_INVARIANT)
    n = len(plain.prompt_tokens)
    assert logits[n - 1:].argmax(axis=1).tolist() == plain.tokens


def test_stops_at_end_of_generation(model, plain, monkeypatch):
    # declare the 3rd generated token an end-of-generation token: decoding must stop right there
    stop = plain.tokens[2]
    first = plain.tokens.index(stop)
    monkeypatch.setattr(model.tokenizer, "eog_ids", frozenset({stop}))
    res = model.generate(PROMPT, max_new_tokens=N_NEW)
    assert res.stop_reason == "eos" and res.tokens == plain.tokens[:first + 1]
    assert res.text == model.tokenizer.decode(plain.tokens[:first])  # the stop token is not shown
    res = model.generate(PROMPT, max_new_tokens=N_NEW, stop_at_eos=False)
    assert res.tokens == plain.tokens


def test_stream_and_callback_see_every_token(model, plain):
    steps = list(model.stream(PROMPT, max_new_tokens=N_NEW, stop_at_eos=False))
    assert all(isinstance(s, Step) for s in steps)
    assert [s.token for s in steps] == plain.tokens and [s.index for s in steps] == list(range(N_NEW))
    assert steps[-1].stop_reason == "max_tokens" and all(s.stop_reason is None for s in steps[:-1])
    assert "".join(s.text for s in steps) == plain.text
    seen = []
    model.generate(plain.prompt_tokens, max_new_tokens=3, stop_at_eos=False, on_token=seen.append)
    assert [s.token for s in seen] == plain.tokens[:3]


def test_stops_when_the_cache_is_full(micro_model_path):
    small = Qwen3.from_gguf(micro_model_path, device="cpu", n_ctx=8, progress=False)
    res = small.generate([1, 2, 3, 4, 5], max_new_tokens=10, stop_at_eos=False, top_k=1)
    assert res.stop_reason == "context" and len(res.tokens) == 4  # cells 5, 6, 7 fed; the 4th token is the last
    with pytest.raises(HiraishinError, match="prompt"):
        small.generate(list(range(8)), max_new_tokens=1)


def test_bad_arguments(model):
    with pytest.raises(HiraishinError, match="max_new_tokens"):
        model.generate(PROMPT, max_new_tokens=0)
    with pytest.raises(HiraishinError, match="empty"):
        model.generate("", max_new_tokens=1)
    with pytest.raises(HiraishinError, match="chat"):
        model.generate([1, 2], max_new_tokens=1, chat=True)


def test_chat_prompt_uses_the_template(model):
    res = model.generate("hi", max_new_tokens=1, chat=True, stop_at_eos=False)
    assert res.prompt_tokens == model.tokenizer.encode_chat("hi")
    assert model.tokenizer.decode(res.prompt_tokens).startswith("<|im_start|>user\nhi")


def test_top_k_of_breaks_ties_by_lower_id():
    ids, vals = top_k_of(np.array([1.0, 3.0, 3.0, -2.0], np.float32), 3)
    assert ids.tolist() == [1, 2, 0] and vals.tolist() == [3.0, 3.0, 1.0]


def test_generate_command(micro_model_path, capsys, plain):
    from hiraishin.cli import main

    rc = main(["generate", str(micro_model_path), PROMPT, "--device", "cpu", "-n", str(N_NEW), "--ignore-eos",
               "-c", "64", "--n-probs", "2"])
    out, err = capsys.readouterr()
    assert rc == 0
    assert out.startswith(plain.text)
    assert "[5]" in out and "batch_invariant" in err and "tok/s" in err


def test_generate_command_llama_cpp_names_and_json(micro_model_path, tmp_path, capsys, plain):
    import json

    from hiraishin.cli import main

    prompt_file = tmp_path / "prompt.txt"
    prompt_file.write_text(PROMPT)
    out = tmp_path / "g.json"
    rc = main(["generate", "-m", str(micro_model_path), "-f", str(prompt_file), "--device", "cpu",
               "--max-new-tokens", str(N_NEW), "--no-stop", "--n-ctx", "64", "--json", str(out), "--seed", "7"])
    assert rc == 0 and capsys.readouterr().out.startswith(plain.text)
    data = json.loads(out.read_text())
    assert data["tokens"] == plain.tokens and data["stop_reason"] == "max_tokens"
    meta = data["meta"]
    assert meta["schema_version"] == 1 and meta["command"] == "generate" and meta["seed"] == 7
    assert len(meta["model_sha256"]) == 64 and meta["device"].startswith("cpu") and meta["date"].endswith("+00:00")


def test_generate_top_k_is_a_deprecated_alias(micro_model_path, capsys):
    from hiraishin.cli import main

    with pytest.warns(FutureWarning, match="--n-probs"):
        rc = main(["generate", str(micro_model_path), PROMPT, "--device", "cpu", "-n", "2", "-c", "64",
                   "--top-k", "2"])
    assert rc == 0 and "[1]" in capsys.readouterr().out


def test_api_refuses_bytes_none_order_and_bad_ids(model):
    from hiraishin.decode.inputs import ArgumentTypeError

    with pytest.raises(ArgumentTypeError, match="bytes"):
        model.generate(b"hi", max_new_tokens=1)
    with pytest.raises(ArgumentTypeError, match="order"):
        model.generate("hi", max_new_tokens=1, order=None)
    with pytest.raises(HiraishinError, match="outside the vocabulary"):
        model.generate([2**63], max_new_tokens=1)
    with pytest.raises(HiraishinError, match="not valid text"):
        model.generate("hi \udcff", max_new_tokens=1)


def test_chat_with_system_and_thinking_switch(model):
    ids = model.tokenizer.encode_chat([{"role": "system", "content": "be brief"},
                                       {"role": "user", "content": "hi"}], enable_thinking=False)
    from hiraishin.decode.greedy import generate

    res = generate(model, "hi", max_new_tokens=1, chat=True, system="be brief", think=False, stop_at_eos=False)
    assert res.prompt_tokens == ids
    assert model.tokenizer.decode(ids).startswith("<|im_start|>system\nbe brief")


def test_a_streamed_pass_shows_the_token_decoding_continues_with_first():
    """greedy_stream's (token, logit, ids, values) as a step's places: the device's token first, even where a NaN
    logit (the device's argmax, which top_k_of puts last) is not ids[0]."""
    import numpy as np

    from hiraishin.decode.greedy import _with_token_first

    ids, vals = np.array([7, 3, 9], np.int64), np.array([2.0, 1.0, 0.5], np.float32)
    got_ids, got_vals = _with_token_first((7, 2.0, ids, vals))
    assert got_ids.tolist() == [7, 3, 9] and got_vals.tolist() == [2.0, 1.0, 0.5]
    got_ids, got_vals = _with_token_first((5, float("nan"), ids, vals))  # a NaN at 5: the device decoded it
    assert got_ids.tolist() == [5, 7, 3] and np.isnan(got_vals[0]) and got_vals[1:].tolist() == [2.0, 1.0]
