"""``hiraishin inspect FILE.gguf``: architecture, config, tokenizer and a tensor table of a Qwen3 GGUF."""

from __future__ import annotations

import argparse


NAME = "inspect"
# Exit status when the file opens but a compute command would refuse it (2 stays "unusable").
EXIT_FLAGGED = 2


def register(subparsers) -> None:
    from . import common

    parser = subparsers.add_parser(
        NAME,
        help="show the config, tokenizer and tensors of a Qwen3 GGUF file",
        description="Validate a Qwen3 GGUF file and print its file type, size, config, tokenizer, a "
        "table of tensor name, type and ggml shape (ne0, ne1), and the bytes per type. Checks what "
        "the compute commands check at load (the tokenizer, the chat template) and exits with "
        f"status {EXIT_FLAGGED} if they would refuse the file.",
    )
    parser.add_argument("file", metavar="FILE.gguf", nargs="?", help="a Qwen3 GGUF file (or -m)")
    parser.add_argument("-m", "--model", dest="model_opt", metavar="FILE.gguf", help="the file (llama.cpp's name)")
    common.add_json(parser, "write the summary as JSON")
    parser.set_defaults(run=run)


def file_type_name(value) -> str:
    """``general.file_type`` as gguf-py names it (``MOSTLY_Q4_K_M``), with the number."""
    from gguf import LlamaFileType

    if value is None:
        return "not recorded (general.file_type missing)"
    try:
        return f"{LlamaFileType(int(value)).name} ({int(value)})"
    except (ValueError, TypeError):
        return f"unknown ({value!r})"


def n_parameters(s: dict) -> int:
    """Weights in the file: the product of every tensor's shape, summed."""
    total = 0
    for _, _, shape, _ in s["tensors"]:
        n = 1
        for d in shape:
            n *= int(d)
        total += n
    return total


def checks(gguf) -> list[tuple[str, str | None]]:
    """``(what, error or None)`` for what the compute commands check when they load the file."""
    from ..errors import HiraishinError
    from ..model.tokenizer import validate_tokenizer

    out = []
    try:
        validate_tokenizer(gguf)
        out.append(("tokenizer", None))
    except HiraishinError as e:
        out.append(("tokenizer", str(e)))
        return out
    try:
        validate_tokenizer(gguf, chat_template=True)
        out.append(("chat template (--chat)", None))
    except HiraishinError as e:
        out.append(("chat template (--chat)", str(e)))
    return out


def run(args: argparse.Namespace) -> int:
    import sys

    from ..errors import HiraishinError
    from ..model.gguf_file import open_qwen3_gguf
    from . import common

    if args.file and args.model_opt and args.file != args.model_opt:
        raise HiraishinError(f"two files given: {args.file!r} and -m {args.model_opt!r}")
    path = args.file or args.model_opt
    if path is None:
        raise HiraishinError("no file given: pass FILE.gguf or -m FILE.gguf")
    common.check_output(args.json, "--json")
    gguf = open_qwen3_gguf(path)
    s = gguf.summary()
    s["file_type_name"] = file_type_name(s["file_type"])
    s["n_parameters"] = n_parameters(s)
    found = checks(gguf)
    s["checks"] = {what: ("ok" if err is None else err) for what, err in found}
    print(format_summary(s))
    if args.json:
        data = dict(s, meta=common.run_meta(NAME, path, None))
        data["tensors"] = [list(t) for t in s["tensors"]]
        print(f"wrote {common.write_json(args.json, data)}")
    failed = [(w, e) for w, e in found if e is not None]
    for what, err in failed:
        print(f"hiraishin inspect: error: {what}: {err}", file=sys.stderr)
    # a broken chat template refuses only --chat; a broken tokenizer refuses every compute command
    return EXIT_FLAGGED if any(w == "tokenizer" for w, _ in failed) else 0


def format_summary(s: dict) -> str:
    """The text ``inspect`` prints for ``Qwen3GGUF.summary()``."""
    c, tok = s["config"], s["tokenizer"]
    lines = [
        f"file          {s['path']} ({_size(s['file_bytes'])})",
        f"architecture  {s['architecture']} (llama.cpp model type: {s['size_label']})",
        f"name          {s['name']}",
        f"file type     {s.get('file_type_name', s['file_type'])}",
        f"model size    {_size(s['tensor_bytes'])} of tensors, "
        f"{s.get('n_parameters', 0) / 1e9:.3g} B parameters" if "n_parameters" in s else
        f"model size    {_size(s['tensor_bytes'])} of tensors",
        "config        " + ", ".join(
            f"{k} {c[k]}" for k in ("n_embd", "n_layer", "n_head", "n_head_kv", "head_dim", "n_ff", "n_vocab")
        ),
        f"              rope_base {c['rope_base']:g}, rms_eps {c['rms_eps']:g}, n_ctx_train {c['n_ctx_train']}",
        "embeddings    " + (
            "tied (token_embd.weight is also the output matrix)" if s["tied_embeddings"]
            else "untied (output.weight is the output matrix)"
        ),
        f"tokenizer     {tok['model']} / pre {tok['pre']}: {tok['n_tokens']} tokens, {tok['n_merges']} merges, "
        f"bos {tok['bos_id']}, eos {tok['eos_id']}, pad {tok['pad_id']}, "
        f"chat template {'yes' if tok['chat_template'] else 'no'}",
        "              token types " + ", ".join(
            f"{_TOKEN_TYPES.get(t, t)} {n}" for t, n in tok["token_type_counts"].items()
        ),
        "",
    ]
    name_width = max(len(name) for name, *_ in s["tensors"])
    lines.append(f"{'tensor':<{name_width}}  {'type':<5} {'ne0':>6} {'ne1':>7} {'bytes':>13}")
    for name, qtype, shape, n_bytes in s["tensors"]:
        ne1 = str(shape[1]) if len(shape) > 1 else ""
        lines.append(f"{name:<{name_width}}  {qtype:<5} {shape[0]:>6} {ne1:>7} {n_bytes:>13,}")
    lines += ["", f"{'type':<5} {'tensors':>7} {'bytes':>15} {'share':>7}"]
    total = s["tensor_bytes"]
    for qtype, (count, n_bytes) in s["bytes_per_type"].items():
        lines.append(f"{qtype:<5} {count:>7} {n_bytes:>15,} {100 * n_bytes / max(total, 1):>6.1f}%")
    lines.append(f"{'total':<5} {len(s['tensors']):>7} {total:>15,} ({_size(total)})")
    if "checks" in s:
        lines.append("")
        lines += [f"check         {what}: {'ok' if res == 'ok' else 'REFUSED: ' + res}"
                  for what, res in s["checks"].items()]
    return "\n".join(lines)


_TOKEN_TYPES = {1: "NORMAL", 2: "UNKNOWN", 3: "CONTROL", 4: "USER_DEFINED", 5: "UNUSED", 6: "BYTE"}


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
