"""Write seeded synthetic Qwen3 Q4_K_M GGUF files laid out exactly as llama.cpp would write them.

Same metadata keys, tensor names, ggml shapes and per-tensor types as ``convert_hf_to_gguf.py``
followed by ``llama-quantize ... Q4_K_M`` (reference §8, §9); only the weights are made up.

Shapes (head_dim is 128 in all of them):

* ``micro``  n_embd 256, 2 layers, 2/1 heads, n_ff 768, 4,096-token vocabulary (the first 4,000
  Qwen3 BPE tokens, the merges among them, Qwen's added tokens renumbered after them), tied.
* ``tiny``   n_embd 512, 4 layers, 4/2 heads, n_ff 1536, full 151,936-token tokenizer, untied.
* ``qwen3-0.6b``, ``qwen3-8b``  the real shapes (tied / untied).

``micro`` and ``tiny`` hold seeded Gaussian weights quantized with ``hiraishin.quant.quantize``:
logits have a spread and outputs are meaningful to compare. ``qwen3-0.6b`` and ``qwen3-8b``
are for timing only: their blocks are random bytes with sensible fp16 scales (fast to write: the
8B file is 4.7 GB), so the model's output is degenerate.

The tensor plan (names, types, shapes, sizes) is a pure function, ``tensor_plan(config)``, so the
Q4_K_M type mix can be checked without writing a file.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from gguf import GGUFWriter
from gguf.constants import GGML_QUANT_VERSION, GGMLQuantizationType
from tqdm import tqdm

from ..atomic import atomic_path
from ..errors import HiraishinError
from .config import ARCHITECTURE, Qwen3Config
from .synth_vocab import MICRO_N_VOCAB, QWEN3_N_VOCAB, qwen3_vocab

# general.file_type of a Q4_K_M file (LLAMA_FTYPE_MOSTLY_Q4_K_M, reference §8.1).
FILE_TYPE_Q4_K_M = 15
# k-quant super-block: every quantized row length must be a multiple of it (QK_K).
QK_K = 256

# Gaussian weights (micro, tiny): standard deviations chosen so that activations and logits have
# a spread (logit std ≈ EMBD_STD * sqrt(n_embd) ≈ 0.8–1.1), norm weights 1 ± a little.
EMBD_STD = 0.05
MATRIX_STD = 0.03
# micro ties its output head to the embedding and has only 2 layers: with MATRIX_STD the
# residual stream stays close to the current token's own embedding, so the tied head's
# argmax is that token again and greedy output repeats one token forever. Stronger layers
# give varied output with close top-2 logits (the regime where reduction order flips tokens).
MICRO_MATRIX_STD = 0.08
NORM_NOISE_STD = 0.05
# Random blocks (qwen3-0.6b, qwen3-8b): uniform ranges for the fp16 scale fields, so that the
# decoded weights are finite, of order 1e-2 and of mean about 0. (Q6_K: d * int8 scale * (q - 32).)
# Q4_K decodes d * sc * q - dmin * m with random 6-bit sc, m (mean 31.5) and 4-bit q (mean 7.5): dmin
# at 7.5 x d centres it. With dmin in d's range (synth format 1) every weight leaned +0.04, the
# activations grew through the layers (swiglu outputs ~4,000 on the 0.6B) until the fp16 block sums
# of llama.cpp's q8_1 overflowed, and every pass through the int8 MMA kernels (SUBBLOCK, BATCH_VARIANT
# past 8 columns) gave NaN logits: timing was unaffected, but their logits digests compared nothing.
RANDOM_SCALE_RANGE = {
    "Q4_K": {"d": (1e-4, 3e-4), "dmin": (7.5e-4, 2.25e-3)},
    "Q6_K": {"d": (6.2e-5, 1.2e-4)},
    "Q8_0": {"d": (2e-4, 6e-4)},
}
# Write tensors in pieces of about this many bytes (bounded memory, a moving progress bar).
CHUNK_BYTES = 32 << 20


@dataclass(frozen=True)
class SynthShape:
    """A synthetic model's shape, vocabulary and how its weights are filled.

    ``vocab``: "micro" or "full". ``fill``: "gaussian" (seeded floats through the reference
    quantizers) or "random" (random block bytes, timing only).
    """

    name: str
    n_embd: int
    n_layer: int
    n_head: int
    n_head_kv: int
    n_ff: int
    vocab: str
    tied: bool
    fill: str
    head_dim: int = 128
    n_ctx_train: int = 40960
    rope_base: float = 1_000_000.0
    rms_eps: float = 1e-6
    matrix_std: float = MATRIX_STD  # std of the Gaussian layer matrices (fill="gaussian")

    def __post_init__(self):
        if self.vocab not in ("micro", "full"):
            raise HiraishinError(f"synthetic shape {self.name!r}: vocab {self.vocab!r}, expected 'micro' or 'full'")
        if self.fill not in ("gaussian", "random"):
            raise HiraishinError(f"synthetic shape {self.name!r}: fill {self.fill!r}, expected 'gaussian' or 'random'")
        # Quantized matrices have n_embd, n_ff or n_head*head_dim columns; llama.cpp would fall
        # back to other types (Q5_0, Q8_0) for rows that are not whole super-blocks.
        for what, n in (("n_embd", self.n_embd), ("n_ff", self.n_ff), ("n_head*head_dim", self.n_head * self.head_dim)):
            if n % QK_K:
                raise HiraishinError(f"synthetic shape {self.name!r}: {what} = {n} is not a multiple of {QK_K}")

    def config(self) -> Qwen3Config:
        """The config a reader gets back from the written file (float keys are stored as float32)."""
        return Qwen3Config(
            n_embd=self.n_embd,
            n_layer=self.n_layer,
            n_head=self.n_head,
            n_head_kv=self.n_head_kv,
            head_dim=self.head_dim,
            n_ff=self.n_ff,
            n_vocab=MICRO_N_VOCAB if self.vocab == "micro" else QWEN3_N_VOCAB,
            rope_base=float(np.float32(self.rope_base)),
            rms_eps=float(np.float32(self.rms_eps)),
            n_ctx_train=self.n_ctx_train,
            tied_embeddings=self.tied,
        )


SHAPES: dict[str, SynthShape] = {
    "micro": SynthShape("micro", n_embd=256, n_layer=2, n_head=2, n_head_kv=1, n_ff=768,
                        vocab="micro", tied=True, fill="gaussian", matrix_std=MICRO_MATRIX_STD),
    "tiny": SynthShape("tiny", n_embd=512, n_layer=4, n_head=4, n_head_kv=2, n_ff=1536,
                       vocab="full", tied=False, fill="gaussian"),
    # Qwen3-0.6B and Qwen3-8B (reference §8.1).
    "qwen3-0.6b": SynthShape("qwen3-0.6b", n_embd=1024, n_layer=28, n_head=16, n_head_kv=8, n_ff=3072,
                             vocab="full", tied=True, fill="random"),
    "qwen3-8b": SynthShape("qwen3-8b", n_embd=4096, n_layer=36, n_head=32, n_head_kv=8, n_ff=12288,
                           vocab="full", tied=False, fill="random"),
}


# --- the Q4_K_M type mix (llama_tensor_get_type, src/llama-quant.cpp; reference §8.4) --------


def use_more_bits(i_layer: int, n_layer: int) -> bool:
    """llama.cpp's choice of layers that get more bits: first and last eighth, every third between."""
    return i_layer < n_layer // 8 or i_layer >= 7 * n_layer // 8 or (i_layer - n_layer // 8) % 3 == 2


_LAYER_NAME = re.compile(r"^blk\.(\d+)\.")


def q4_k_m_type(name: str, shape: tuple[int, ...], n_layer: int, tied: bool) -> str:
    """The type llama-quantize gives tensor ``name`` in a Q4_K_M file."""
    if len(shape) == 1 or name.endswith("_norm.weight"):
        return "F32"  # norms and other 1-D tensors are not quantized
    if name == "output.weight" or (tied and name == "token_embd.weight"):
        return "Q6_K"  # the output rule; with tied embeddings token_embd is the output
    if name.endswith(".attn_v.weight") or name.endswith(".ffn_down.weight"):
        i_layer = int(_LAYER_NAME.match(name).group(1))
        return "Q6_K" if use_more_bits(i_layer, n_layer) else "Q4_K"
    return "Q4_K"


@dataclass(frozen=True)
class PlannedTensor:
    """One tensor as it will be written: ggml shape (ne0, ne1) and stored type."""

    name: str
    qtype: str
    shape: tuple[int, ...]
    n_bytes: int

    @property
    def rows(self) -> int:
        return self.shape[1] if len(self.shape) > 1 else 1

    @property
    def row_bytes(self) -> int:
        return self.n_bytes // self.rows


def tensor_plan(config: Qwen3Config) -> list[PlannedTensor]:
    """Every tensor of a Q4_K_M Qwen3 file for ``config``, in file order."""
    from ..quant import row_bytes

    plan = []
    for name, shape in config.tensor_shapes().items():
        qtype = q4_k_m_type(name, shape, config.n_layer, config.tied_embeddings)
        rows = shape[1] if len(shape) > 1 else 1
        plan.append(PlannedTensor(name, qtype, shape, rows * row_bytes(shape[0], qtype)))
    return plan


# --- writing ---------------------------------------------------------------------------------


def write_synthetic(path: str | os.PathLike[str], shape: str | SynthShape = "tiny", seed: int = 0,
                    progress: bool = True) -> Path:
    """Write a synthetic Qwen3 Q4_K_M GGUF to ``path`` and return it as a Path.

    The same (shape, seed) always gives the same bytes. Tensors are streamed to disk piece by
    piece; the file appears under its name only once complete. ``qwen3-0.6b`` / ``qwen3-8b``
    files are for timing only (random blocks: finite, meaningless output).
    """
    spec = _resolve_shape(shape)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise HiraishinError(f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    path = Path(path)
    config = spec.config()
    plan = tensor_plan(config)
    vocab = qwen3_vocab(spec.vocab)

    if not path.parent.is_dir():
        raise HiraishinError(f"{path}: cannot write: folder {path.parent} does not exist")
    try:
        # A unique temporary name beside ``path``, renamed over it when complete: concurrent
        # writers each produce a whole file (the last rename wins), and SIGINT/SIGTERM leave no
        # partial file (hiraishin.atomic registers the temporary name for cleanup).
        with atomic_path(path) as tmp:
            _write_file(tmp, spec, config, plan, vocab, seed, progress, label=path.name)
    except OSError as exc:
        raise HiraishinError(f"{path}: cannot write: {exc.strerror or exc}") from None
    return path


def _write_file(tmp: Path, spec: SynthShape, config: Qwen3Config, plan: list[PlannedTensor], vocab, seed: int,
                progress: bool, label: str) -> None:
    writer = GGUFWriter(tmp, ARCHITECTURE)
    try:
        _add_metadata(writer, config, vocab, f"hiraishin synthetic Qwen3 {spec.name} (seed {seed})")
        for t in plan:
            if t.qtype == "F32":
                writer.add_tensor_info(t.name, tuple(reversed(t.shape)), np.dtype(np.float32), t.n_bytes)
            else:  # numpy byte shape (rows, row_bytes); gguf-py turns it into the ggml shape
                writer.add_tensor_info(t.name, (t.rows, t.row_bytes), np.dtype(np.uint8), t.n_bytes,
                                       raw_dtype=GGMLQuantizationType[t.qtype])
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        fout = writer.fout[0]
        writer.write_padding(fout, fout.tell())  # the data section starts aligned
        total = sum(t.n_bytes for t in plan)
        with tqdm(total=total, unit="B", unit_scale=True, desc=f"writing {label}", disable=not progress) as bar:
            for index, t in enumerate(plan):
                # One generator per tensor: its bytes depend on (seed, position) only.
                rng = np.random.default_rng([seed, index])
                for piece in _tensor_pieces(t, spec.fill, rng, spec.matrix_std):
                    fout.write(piece.data)
                    bar.update(piece.nbytes)
                writer.write_padding(fout, t.n_bytes)
    finally:
        writer.close()


def _resolve_shape(shape: str | SynthShape) -> SynthShape:
    if isinstance(shape, SynthShape):
        return shape
    try:
        return SHAPES[shape]
    except (KeyError, TypeError):
        raise HiraishinError(f"unknown synthetic shape {shape!r}; choose one of {', '.join(SHAPES)}") from None


def _add_metadata(writer: GGUFWriter, config: Qwen3Config, vocab, name: str) -> None:
    """The keys convert_hf_to_gguf.py + llama-quantize write for Qwen3, in their order."""
    writer.add_type("model")
    writer.add_name(name)
    writer.add_block_count(config.n_layer)
    writer.add_context_length(config.n_ctx_train)
    writer.add_embedding_length(config.n_embd)
    writer.add_feed_forward_length(config.n_ff)
    writer.add_head_count(config.n_head)
    writer.add_head_count_kv(config.n_head_kv)
    writer.add_rope_freq_base(config.rope_base)
    writer.add_layer_norm_rms_eps(config.rms_eps)
    writer.add_key_length(config.head_dim)
    writer.add_value_length(config.head_dim)
    writer.add_file_type(FILE_TYPE_Q4_K_M)
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.token_types)
    writer.add_token_merges(vocab.merges)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_pad_token_id(vocab.pad_id)
    writer.add_bos_token_id(vocab.bos_id)
    if vocab.add_bos is not None:
        writer.add_add_bos_token(vocab.add_bos)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)
    writer.add_quantization_version(GGML_QUANT_VERSION)


def _tensor_pieces(t: PlannedTensor, fill: str, rng: np.random.Generator,
                   matrix_std: float = MATRIX_STD):
    """The tensor's bytes in row ranges of about CHUNK_BYTES."""
    if t.qtype == "F32":  # norm weights: 1 ± noise
        yield (1.0 + NORM_NOISE_STD * rng.standard_normal(t.shape[0], dtype=np.float32)).astype(np.float32)
        return
    if fill == "gaussian":
        from ..quant import quantize

        std = EMBD_STD if t.name in ("token_embd.weight", "output.weight") else matrix_std
        rows_per_piece = max(1, CHUNK_BYTES // 4 // t.shape[0])  # sized by the float32 input
        for start in range(0, t.rows, rows_per_piece):
            n = min(rows_per_piece, t.rows - start)
            x = rng.standard_normal((n, t.shape[0]), dtype=np.float32)
            x *= np.float32(std)
            yield quantize(x, t.qtype)
    else:
        rows_per_piece = max(1, CHUNK_BYTES // t.row_bytes)
        for start in range(0, t.rows, rows_per_piece):
            yield _random_blocks(rng, min(rows_per_piece, t.rows - start), t.row_bytes, t.qtype)


def _random_blocks(rng: np.random.Generator, rows: int, row_bytes: int, qtype: str) -> np.ndarray:
    """Random bytes shaped (rows, row_bytes), with every fp16 scale field set to a finite value."""
    from ..quant import BLOCK_DTYPES

    n = rows * row_bytes
    raw = rng.bit_generator.random_raw(-(-n // 8)).view(np.uint8)[:n]
    blocks = raw.view(BLOCK_DTYPES[qtype])
    for field, (low, high) in RANDOM_SCALE_RANGE[qtype].items():
        blocks[field] = rng.uniform(low, high, blocks.shape).astype(np.float16)
    return raw.reshape(rows, row_bytes)


# --- a verified cache of synthetic models (demo, notebooks) --------------------------------------

# Environment variable naming the cache folder; without it ``~/.cache/hiraishin``.
CACHE_ENV = "HIRAISHIN_CACHE"
# The sidecar beside each cached file: its size and sha256 as written, and the generator version.
SIDECAR_SUFFIX = ".sha256.json"
# Bump when write_synthetic's bytes for a (shape, seed) change: older cache entries are rewritten.
SYNTH_FORMAT = 2
# Files up to this size are hashed on every use (sha256 runs at ~1 GB/s: 64 MiB costs well under
# 0.1 s); larger ones only have their size checked unless ``verify="sha256"``.
HASH_ON_USE_BYTES = 64 << 20
VERIFY_MODES = ("auto", "size", "sha256")


def default_cache_dir() -> Path:
    """``$HIRAISHIN_CACHE``, else ``~/.cache/hiraishin``."""
    env = os.environ.get(CACHE_ENV)
    return Path(env) if env else Path.home() / ".cache" / "hiraishin"


def _notice_to_stderr(message: str) -> None:
    import sys

    print(message, file=sys.stderr, flush=True)


def _sha256(path: Path) -> str:
    import hashlib

    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _cache_problem(path: Path, sidecar: Path, verify: str) -> str | None:
    """Why the cached ``path`` cannot be used as is (one short phrase), or None if it is good."""
    import json

    if not path.exists():
        return "missing"
    try:
        record = json.loads(sidecar.read_text(encoding="utf-8"))
        size, digest, fmt = int(record["size"]), str(record["sha256"]), record.get("format")
    except FileNotFoundError:
        return f"has no record {sidecar.name}"
    except (OSError, ValueError, KeyError, TypeError):
        return f"has an unreadable record {sidecar.name}"
    if fmt != SYNTH_FORMAT:
        return f"was written by synth format {fmt!r} (now {SYNTH_FORMAT})"
    actual = path.stat().st_size
    if actual != size:
        return f"is {actual} bytes, {size} were written (truncated or replaced)"
    if verify == "sha256" or (verify == "auto" and size <= HASH_ON_USE_BYTES):
        if _sha256(path) != digest:
            return "has a sha256 that differs from the one recorded at write (corrupted)"
    return None


def cached_file(name: str, write, cache_dir: str | os.PathLike[str] | None = None, *, verify: str = "auto",
                notice=_notice_to_stderr) -> tuple[Path, bool]:
    """A verified cache entry: ``(path, True)`` if ``cache_dir/name`` was good, else ``(path, False)``
    after writing it with ``write(tmp_path)``.

    ``write`` must write the whole file to the path it is given and be deterministic (the same
    bytes every time: concurrent processes may both write the entry, the last rename wins). The
    file's size and sha256 are recorded in ``name + ".sha256.json"`` beside it (written
    atomically, after the file); every use checks the size, and the sha256 too when
    ``verify="sha256"``, or with ``"auto"`` for files up to ``HASH_ON_USE_BYTES``. A missing,
    truncated or corrupted entry is rewritten, with one line to ``notice`` saying why (``None``:
    silent). Raises ``HiraishinError`` naming the folder if it cannot be created or written.
    """
    import json

    from ..atomic import atomic_path, atomic_write

    if verify not in VERIFY_MODES:
        raise HiraishinError(f"verify must be one of {', '.join(VERIFY_MODES)}, got {verify!r}")
    if not isinstance(name, str) or not name or os.sep in name or name.startswith("."):
        raise HiraishinError(f"cache entry name must be a plain file name, got {name!r}")
    folder = Path(cache_dir) if cache_dir is not None else default_cache_dir()
    path, sidecar = folder / name, folder / (name + SIDECAR_SUFFIX)
    problem = _cache_problem(path, sidecar, verify)
    if problem is None:
        return path, True
    if problem != "missing" and notice is not None:
        notice(f"hiraishin: cached {path} {problem}; writing it again")
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            write(tmp)
            # Hash what was written, before it becomes visible: the record describes these bytes.
            record = {"name": name, "size": tmp.stat().st_size, "sha256": _sha256(tmp), "format": SYNTH_FORMAT}
        with atomic_write(sidecar) as f:
            json.dump(record, f, indent=1)
            f.write("\n")
    except OSError as exc:
        raise HiraishinError(f"{folder}: cannot write the model cache: {exc.strerror or exc}") from None
    return path, False


def cached_model(shape: str | SynthShape = "micro", seed: int = 0, cache_dir: str | os.PathLike[str] | None = None,
                 *, noise: float | None = None, draft_writer=None, verify: str = "auto",
                 notice=_notice_to_stderr) -> Path:
    """Path of a synthetic model in the cache (``$HIRAISHIN_CACHE`` or ``~/.cache/hiraishin``),
    written once by :func:`write_synthetic` and verified on every use (see :func:`cached_file`).

    With ``noise`` (a float), the path of a noisy draft of that model instead:
    ``draft_writer(target_path, out_path)`` writes it (e.g. a closure over
    ``hiraishin.decode.draft.write_draft`` with the noise and its seed); the entry is named after
    ``noise``, so ``draft_writer`` must depend on nothing else but the target.
    """
    spec = _resolve_shape(shape)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise HiraishinError(f"seed must be a non-negative integer, got {seed!r}")
    seed = int(seed)
    stem = f"qwen3-{spec.name}"
    if spec != SHAPES.get(spec.name):  # a custom shape: its name alone does not say what it holds
        import hashlib

        stem += "-" + hashlib.sha256(repr(spec).encode()).hexdigest()[:10]
    target, _ = cached_file(f"{stem}-seed{seed}.gguf",
                            lambda p: write_synthetic(p, shape=spec, seed=seed, progress=False),
                            cache_dir, verify=verify, notice=notice)
    if noise is None:
        return target
    if draft_writer is None:
        raise HiraishinError("cached_model: noise given without a draft_writer(target_path, out_path)")
    if isinstance(noise, bool) or not isinstance(noise, (int, float)) or not np.isfinite(noise) or noise < 0:
        raise HiraishinError(f"noise must be a finite non-negative number, got {noise!r}")
    draft, _ = cached_file(f"{stem}-seed{seed}-draft-noise{noise:g}.gguf", lambda p: draft_writer(target, p),
                           cache_dir, verify=verify, notice=notice)
    return draft
