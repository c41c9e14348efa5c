"""``hiraishin inspect FILE.gguf``: architecture, config, tokenizer and a tensor table of a Qwen3 GGUF."""

from __future__ import annotations

import argparse


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "inspect",
        help="show the config, tokenizer and tensors of a Qwen3 GGUF file",
        description="Validate a Qwen3 GGUF file and print its config, tokenizer, a table of tensor "
        "name, type and ggml shape (ne0, ne1), and the bytes per type.",
    )
    parser.add_argument("file", metavar="FILE.gguf", help="a Qwen3 GGUF file")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ..model.gguf_file import open_qwen3_gguf

    print(format_summary(open_qwen3_gguf(args.file).summary()))
    return 0


def format_summary(s: dict) -> str:
    """The text ``inspect`` prints for ``Qwen3GGUF.summary()``."""
    c, tok = s["config"], s["tokenizer"]
    lines = [
        f"file          {s['path']} ({_size(s['file_bytes'])})",
        f"architecture  {s['architecture']} (llama.cpp model type: {s['size_label']})",
        f"name          {s['name']}",
        f"file type     {s['file_type']}",
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
    return "\n".join(lines)


_TOKEN_TYPES = {1: "NORMAL", 2: "UNKNOWN", 3: "CONTROL", 4: "USER_DEFINED", 5: "UNUSED", 6: "BYTE"}


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"
