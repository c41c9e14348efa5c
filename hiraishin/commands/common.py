"""What every subcommand shares: one vocabulary of arguments (llama.cpp's names as aliases), the
checks that run before any weight is loaded, and the files a command writes.

llama.cpp names accepted where they mean the same thing: ``-m/--model``, ``-p/--prompt``,
``-f/--file``, ``-n/--n-predict``, ``-c/--ctx-size``, ``--seed``, ``--ignore-eos``,
``-md/--model-draft``, ``--draft-max``, ``--draft-min``, ``--draft-p-min``; llama-server's
``--n-probs`` for the top logits printed per token.
"""

from __future__ import annotations

import argparse
import datetime
import hashlib
import math
import os
import platform
import sys
from pathlib import Path

from .. import __version__
from ..errors import HiraishinError
from ..order import ReductionOrder

ORDERS = {
    "variant": ReductionOrder.BATCH_VARIANT,
    "invariant": ReductionOrder.BATCH_INVARIANT,
    "fixed_split": ReductionOrder.FIXED_SPLIT,
    "subblock": ReductionOrder.SUBBLOCK,
}
# One default for every command: the order under which speculative decoding is exact.
DEFAULT_ORDER = "invariant"
ORDER_HELP = """\
reduction orders (--order):
  variant      stock llama.cpp geometry: the mat-vec's warp count comes from the batch width
               (4 warps for 1-4 columns, 2 for 5-8), batches wider than 8 go to MMQ's order,
               attention sizes its parallel blocks from the occupancy of whichever kernel it
               launches (one-query vector kernel or multi-query tile kernel). Logits depend on
               how many tokens share a pass: speculative decoding is not exact.
  invariant    every column walks the one-token geometry, batches are split into launches of
               at most 8 columns, attention sizes its parallel blocks from the one-query kernel,
               and verify batches stop at multiples of 256 KV cells. Logits are bit-identical
               for any batch: speculative decoding emits plain greedy decoding's tokens.
  fixed_split  invariant mat-vec; attention splits the KV cache at fixed 256-cell positions
               (SGLang's deterministic mode) instead of into a fixed number of blocks.
  subblock     an exact order built for the batch: Q4_K/Q6_K mat-vecs scale and add each 32-value
               sub-block's integer dot product in k order, in K-segments fixed by the row length,
               so 1 and 16 columns do the same float work (int8 tensor cores take the extra
               columns); attention as invariant. Its own reference: its bits differ from the others'.
"""

# Bytes of one KV cell per layer and KV head dimension: K and V, f16 (2 bytes) each.
KV_BYTES_PER_ELEMENT = 2
KV_TENSORS = 2
# Reading the model file for its sha256 in pieces of this size keeps memory flat.
HASH_CHUNK_BYTES = 8 << 20
# Exit status of a run interrupted by Ctrl-C (128 + SIGINT), as shells report it.
EXIT_INTERRUPTED = 130


def parse_order(name: str) -> ReductionOrder:
    """``variant`` / ``invariant`` / ``fixed_split`` / ``subblock`` (or a preset's full name) -> the preset."""
    key = name.lower().removeprefix("batch_")
    if key not in ORDERS:
        raise argparse.ArgumentTypeError(f"unknown order {name!r}; choose from {', '.join(ORDERS)}")
    return ORDERS[key]


def _int(text: str, minimum: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer ({what}), got {text!r}") from None
    if value < minimum:
        raise argparse.ArgumentTypeError(f"must be an integer >= {minimum} ({what}), got {value}")
    return value


def positive_int(text: str) -> int:
    """An integer >= 1."""
    return _int(text, 1, ">= 1")


def nonneg_int(text: str) -> int:
    """An integer >= 0."""
    return _int(text, 0, ">= 0")


def finite_float(lo: float = -math.inf, hi: float = math.inf):
    """A parser of finite floats in ``lo..hi`` (NaN and infinities are refused)."""
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"must be in {lo:g}..{hi:g}, got {value:g}")
        return value
    return parse


def parse_batch_sizes(text: str) -> list[int]:
    """``"2,3,5"`` -> ``[2, 3, 5]``."""
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"batch sizes must be comma-separated integers, got {text!r}") from None
    if not sizes or min(sizes) < 1:
        raise argparse.ArgumentTypeError(f"batch sizes must be integers >= 1, got {text!r}")
    return sizes


# ---- argument groups ---------------------------------------------------------------------------

def add_model(p: argparse.ArgumentParser, metavar: str = "MODEL.gguf", required: bool = True) -> None:
    """The model: positional, or ``-m/--model`` (llama.cpp)."""
    p.add_argument("model", metavar=metavar, nargs="?", help="a Qwen3 GGUF file (or -m)")
    p.add_argument("-m", "--model", dest="model_opt", metavar=metavar, help="the model (llama.cpp's name)")
    p.set_defaults(model_required=required)


def model_path(args) -> str | None:
    """The model given positionally or with ``-m`` (both: an error)."""
    if args.model and args.model_opt and args.model != args.model_opt:
        raise HiraishinError(f"two models given: {args.model!r} and -m {args.model_opt!r}")
    path = args.model or args.model_opt
    if path is None and getattr(args, "model_required", True):
        raise HiraishinError("no model given: pass MODEL.gguf or -m MODEL.gguf")
    return path


def add_prompt(p: argparse.ArgumentParser, default: str | None = None, positional: bool = False) -> None:
    """``-p/--prompt``, ``-f/--file``, ``--chat`` with ``--system`` and ``--think/--no-think``."""
    if positional:
        p.add_argument("prompt_pos", metavar="PROMPT", nargs="?", help="prompt text (or -p / -f)")
    p.add_argument("-p", "--prompt", default=None,
                   help="prompt text, or ids:1,2,3 for raw token ids" + (f" (default {default!r})" if default else ""))
    p.add_argument("-f", "--file", metavar="FILE", help="read the prompt from FILE (UTF-8)")
    p.add_argument("--chat", action="store_true", help="wrap the prompt in the model's chat template")
    p.add_argument("--system", metavar="TEXT", help="a system message (with --chat)")
    p.add_argument("--think", action=argparse.BooleanOptionalAction, default=None,
                   help="Qwen3's thinking switch: the chat template's enable_thinking (with --chat; "
                        "default: the template's own default)")
    p.set_defaults(prompt_default=default)


def read_prompt(args) -> str:
    """The prompt text from ``-f``, ``-p`` or the positional argument; checked, never empty."""
    given = [(name, v) for name, v in (("PROMPT", getattr(args, "prompt_pos", None)), ("--prompt", args.prompt))
             if v is not None]
    if args.file is not None:
        given.append(("--file", args.file))
    if len(given) > 1:
        raise HiraishinError(f"give the prompt once: got {' and '.join(n for n, _ in given)}")
    if args.file is not None:
        try:
            data = Path(args.file).read_bytes()
        except OSError as e:
            raise HiraishinError(f"--file {args.file}: {e.strerror or e}") from None
        try:
            text, what = data.decode("utf-8"), f"--file {args.file}"
        except UnicodeDecodeError as e:
            raise HiraishinError(f"--file {args.file}: not valid UTF-8 (byte 0x{data[e.start]:02x} at "
                                 f"offset {e.start})") from None
    elif given:
        what, text = given[0]
    elif args.prompt_default is not None:
        what, text = "--prompt", args.prompt_default
    else:
        raise HiraishinError("no prompt given: pass -p TEXT or -f FILE")
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        # Python hands undecodable argv bytes over as lone surrogates (PEP 383)
        raw = text[e.start].encode("utf-8", "surrogateescape")
        raise HiraishinError(f"{what}: not valid UTF-8 (byte 0x{raw[0]:02x} at character {e.start})") from None
    if not text:
        raise HiraishinError(f"{what} is empty: give at least one token of text")
    if (args.system is not None or args.think is not None) and not args.chat:
        raise HiraishinError("--system and --think/--no-think need --chat")
    return text


def prompt_ids(model, text: str, args) -> list[int]:
    """Token ids of the prompt: the tokenizer (with the chat template under ``--chat``), or ids:1,2,3."""
    from ..decode.inputs import encode_text

    if text.startswith("ids:") or model.tokenizer is None:
        if args.chat:
            raise HiraishinError("--chat needs a text prompt, not ids:")
        body = text.removeprefix("ids:")
        try:
            ids = [int(t) for t in body.split(",") if t.strip()]
        except ValueError:
            what = "give the prompt as ids:1,2,3" if model.tokenizer is None else "ids: takes integers"
            raise HiraishinError(f"{model.name}: {what} (got {text[:40]!r})") from None
        if not ids:
            raise HiraishinError("the prompt has no token ids")
        n_vocab = model.config.n_vocab
        bad = [t for t in ids if not 0 <= t < n_vocab]
        if bad:
            raise HiraishinError(f"prompt token id {bad[0]} is outside the vocabulary 0..{n_vocab - 1}")
        return ids
    ids = encode_text(model, text, chat=args.chat, system=args.system, think=args.think)
    if not ids:
        raise HiraishinError("the prompt encodes to no tokens")
    return ids


def add_n_predict(p: argparse.ArgumentParser, default: int, *old_names: str, minimum: int = 1) -> None:
    """``-n/--n-predict`` (llama.cpp), with the command's older names as aliases."""
    p.add_argument("-n", "--n-predict", *old_names, dest="n_predict", type=positive_int if minimum else nonneg_int,
                   default=default, metavar="N", help=f"tokens to generate (default {default})")


def add_run_options(p: argparse.ArgumentParser, json_help: str = "write the result as JSON") -> None:
    """``--order``, ``--device``, ``-c/--ctx-size``, ``--seed``, ``--json``."""
    p.add_argument("--order", type=parse_order, default=ORDERS[DEFAULT_ORDER],
                   help=f"variant | invariant | fixed_split | subblock (default {DEFAULT_ORDER}; see below)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"],
                   help="cuda (CuPy kernels), cpu (the Numba emulator, same bits) or auto")
    p.add_argument("-c", "--ctx-size", "--n-ctx", dest="n_ctx", type=positive_int, default=None, metavar="N",
                   help="KV cache cells (default: enough for the run)")
    p.add_argument("--seed", type=nonneg_int, default=None,
                   help="accepted for llama.cpp compatibility and recorded in JSON; greedy decoding "
                        "draws no random numbers")
    add_json(p, json_help)


def add_json(p: argparse.ArgumentParser, json_help: str = "write the result as JSON") -> None:
    p.add_argument("--json", metavar="OUT.json", help=json_help)


def add_ignore_eos(p: argparse.ArgumentParser, *old_names: str) -> None:
    p.add_argument("--ignore-eos", *old_names, dest="ignore_eos", action="store_true",
                   help="do not stop at end-of-generation tokens")


def epilog() -> str:
    return ORDER_HELP


def formatter():
    return argparse.RawDescriptionHelpFormatter


# ---- checks before any weight is loaded ---------------------------------------------------------

def check_output(path: str | None, what: str) -> None:
    """Refuse an output path that cannot be written, before the computation."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise HiraishinError(f"{what} {path}: is a folder")
    folder = p.parent if str(p.parent) else Path(".")
    if not folder.is_dir():
        raise HiraishinError(f"{what} {path}: folder {folder} does not exist")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise HiraishinError(f"{what} {path}: folder {folder} is not writable")
    if p.exists() and not os.access(p, os.W_OK):
        raise HiraishinError(f"{what} {path}: file is not writable")


def check_plot(path: str | None) -> None:
    """Refuse a plot path whose extension matplotlib cannot write, or that cannot be written."""
    if path is None:
        return
    check_output(path, "--plot")
    from matplotlib.figure import Figure

    ext = Path(path).suffix.lower().lstrip(".")
    supported = Figure().canvas.get_supported_filetypes()
    if ext not in supported:
        raise HiraishinError(f"--plot {path}: unsupported extension {ext!r}; use one of "
                             f"{', '.join(sorted(supported))}")


def open_header(path: str):
    """The GGUF's parsed header (config, tokenizer lists), without loading weights."""
    from ..model.gguf_file import open_qwen3_gguf

    return open_qwen3_gguf(path)


def kv_bytes_per_cell(config) -> int:
    """Bytes one KV cache cell takes over all layers: K and V, f16, n_head_kv * head_dim each."""
    return KV_TENSORS * config.n_layer * config.n_head_kv * config.head_dim * KV_BYTES_PER_ELEMENT


def available_memory(device: str) -> tuple[int | None, str]:
    """Free bytes where the KV cache would live, and where that is (None: unknown)."""
    if device in ("cuda", "auto"):
        try:
            import cupy

            free, _ = cupy.cuda.runtime.memGetInfo()
            return int(free), "free GPU memory"
        except Exception:
            if device == "cuda":
                return None, "GPU memory"
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024, "available host memory"
    except OSError:
        pass
    try:
        return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"), "available host memory"
    except (ValueError, OSError, AttributeError):
        return None, "memory"


def check_ctx(n_ctx: int, config, device: str) -> None:
    """Refuse a KV cache that cannot fit, saying how many cells would."""
    per_cell = kv_bytes_per_cell(config)
    free, where = available_memory(device)
    if free is not None and n_ctx * per_cell > free:
        raise HiraishinError(
            f"--ctx-size {n_ctx}: the KV cache would take {n_ctx * per_cell / 2**30:.1f} GiB "
            f"({per_cell:,} bytes per cell: 2 x {config.n_layer} layers x {config.n_head_kv} KV heads x "
            f"{config.head_dim} x 2 bytes); {where} is {free / 2**30:.1f} GiB, which fits at most "
            f"{free // per_cell:,} cells")


def kv_cells(n_tokens: int) -> int:
    """KV cache cells for ``n_tokens`` positions: rounded up to the 256-cell attention padding."""
    return max(256, -(-n_tokens // 256) * 256)


def context_for(prompt: str, n_new: int, chat: bool = False) -> int:
    """KV cells enough for ``prompt`` plus ``n_new`` tokens (a byte-level BPE token is at least one
    byte; a chat template adds a few hundred bytes at most)."""
    from ..model.qwen3 import DEFAULT_N_CTX

    chat_extra = CHAT_TEMPLATE_SLACK if chat else 0
    return max(DEFAULT_N_CTX, kv_cells(len(prompt.encode()) + n_new + 1 + chat_extra))


# Tokens a chat template may add around the prompt (role markers, a default system message).
CHAT_TEMPLATE_SLACK = 512


# ---- what the outputs record --------------------------------------------------------------------

def file_sha256(path) -> str:
    """sha256 of a file, read in pieces."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(HASH_CHUNK_BYTES), b""):
            h.update(chunk)
    return h.hexdigest()


def device_description(backend_name: str | None) -> str:
    """The device a run used, in words: the GPU's name on CUDA, the CPU otherwise."""
    if backend_name == "cuda":
        try:
            import cupy

            props = cupy.cuda.runtime.getDeviceProperties(cupy.cuda.Device().id)
            name = props["name"]
            return f"cuda: {name.decode() if isinstance(name, bytes) else name}"
        except Exception:
            return "cuda"
    cpu = platform.processor() or platform.machine()
    return f"{backend_name or 'cpu'}: {cpu}, {os.cpu_count()} cores"


def run_meta(command: str, model_file: str | None, backend_name: str | None, **extra) -> dict:
    """What every JSON output records: schema version, library version, model file and its sha256,
    the date (UTC), the device and the command line."""
    from ..decode.report import POSITION_NOTE, SCHEMA_VERSION

    meta = {
        "schema_version": SCHEMA_VERSION,
        "hiraishin_version": __version__,
        "command": command,
        "argv": sys.argv[1:],
        "model_file": None if model_file is None else str(model_file),
        "model_sha256": None if model_file is None else file_sha256(model_file),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "device": device_description(backend_name),
        "position_note": POSITION_NOTE,
    }
    meta.update(extra)
    return meta


def write_json(path, data: dict) -> Path:
    """Write ``data`` as standard JSON, atomically (NaN -> null, noted under meta.non_finite)."""
    from ..decode.report import dump_json

    return dump_json(data, path)


def save_figure(fig, path, dpi: int = 120) -> Path:
    """Save a matplotlib Figure atomically (an interrupted save leaves the old file, or none)."""
    from ..atomic import atomic_path

    path = Path(path)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=dpi, format=path.suffix.lstrip(".").lower())
    return path
