"""What each kind of small launch costs a graph-replayed one-token pass: the pass timed whole, then
with one kind of launch left out of the captured graph (the outputs are garbage; only the time is
read). The difference is the most that fusing that launch away could save, the figure to weigh a
fusion by before writing it. Two variants replace rather than remove: the norm launch by an elementwise
launch of the same reads and q8_1 writes (a norm whose reduction is off the chain), and the lone Q6_K V
mat-vec beside the Q+K launch left out (one launch for both types).

    python3 bench/ablate_pass.py MODEL.gguf [MODEL.gguf ...] [--order invariant] [--steps 40] [--json F] [--plot PNG]
    python3 bench/ablate_pass.py --from-json F --plot PNG   # the figure of an earlier run

Each variant loads the model afresh with some launchers of ``hiraishin.backends.cuda`` replaced by
no-ops, captures its graph, and times back-to-back replays (``bench/host_overhead.py``'s measure).
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path
from unittest import mock

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import host_overhead  # noqa: E402
from benchlib import write_rows_json  # noqa: E402

from hiraishin.backends import cuda as cuda_backend  # noqa: E402
from hiraishin.backends import cuda_attention  # noqa: E402


def _skip(*args, **kwargs):
    return None


def _skip_qk(q, k, v, q_norm_w, k_norm_w, eps, pos, cos_t, sin_t, q_out, k_cache, v_cache, k_out=None):
    return q_out


def _norm_as_elementwise(a, b, w, eps, out_sum, out_q, out_norm=None, layout=None, out_q2=None, layout2=None):
    # the add + RMSNorm + q8_1 launch replaced by an elementwise one of the same reads and q8_1 writes
    # (SwiGLU's): what a norm whose reduction is off the chain (its scale applied after the mat-vec)
    # could cost at most
    return cuda_backend.launch_swiglu_q8_1(a, b, out_q, None, layout)


_run_matvecs = cuda_backend.CudaOps._run_matvecs
_get_rows = cuda_backend.CudaOps.get_rows
_argmax_rows = cuda_backend.CudaOps.argmax_rows


def _skip_get_rows(self, table, qtype, ids, out=None):
    # the embedding launch left out (the pass's buffer keeps what it held): what fusing the embedding
    # into the first norm launch could save at most
    return out if out is not None else _get_rows(self, table, qtype, ids)


def _skip_argmax(self, x, out=None, advance=None, pos=None):
    # the argmax launch at a pass's end left out: what an argmax inside the output head could save at most
    return out if out is not None else _argmax_rows(self, x, out, advance, pos)


def _grouped_only(self, weights, mvs, xqs, T, outs):
    # a mat-vec launched alone beside a group of one call (the Q6_K attn_v beside the Q4_K Q+K
    # launch) left out: what one launch for both types could save at most. Alone means alone in its
    # group: V has a group key of its own (its type), with one member.
    members: dict = {}
    for i, mv in enumerate(mvs):
        members.setdefault(mv.group if mv.group is not None else ("alone", i), []).append(i)
    if len(members) > 1 and any(len(idx) > 1 for idx in members.values()):
        keep = sorted(i for idx in members.values() if len(idx) > 1 for i in idx)
        out = _run_matvecs(self, [weights[i] for i in keep], [mvs[i] for i in keep], xqs, T,
                           None if outs is None else [outs[i] for i in keep])
        res = [None] * len(mvs)
        for i, r in zip(keep, out):
            res[i] = r
        return [r if r is not None else (outs[i] if outs is not None and outs[i] is not None else
                                         self._empty((T, mvs[i].n), "float32")) for i, r in enumerate(res)]
    return _run_matvecs(self, weights, mvs, xqs, T, outs)


# variant name -> launchers of hiraishin.backends.cuda left out of the pass
VARIANTS = {
    "whole pass": {},
    "no add+norm": {"launch_add_rms_norm_q8_1": _skip},
    "no swiglu": {"launch_swiglu_q8_1": _skip},
    "no qk norm+rope+kv": {"launch_qk_norm_rope_kv": _skip_qk},  # (up to four tokens: run with HIRAISHIN_ATTN_ROPE=0, else no launch to skip)
    "no combine": {"launch_combine_q8_1": _skip},
    "no attention partials": {"launch_partials": _skip, "launch_attention_q8_1": _skip},
    "norm as elementwise": {"launch_add_rms_norm_q8_1": _norm_as_elementwise},
    "no lone V mat-vec": {"CudaOps._run_matvecs": _grouped_only},
    "no embedding": {"CudaOps.get_rows": _skip_get_rows},
    "no argmax": {"CudaOps.argmax_rows": _skip_argmax},
    "mat-vecs only": {"launch_add_rms_norm_q8_1": _skip, "launch_swiglu_q8_1": _skip,
                      "launch_qk_norm_rope_kv": _skip_qk, "launch_combine_q8_1": _skip, "launch_partials": _skip,
                      "launch_attention_q8_1": _skip},
}


@contextlib.contextmanager
def ablated(variant: str):
    """The CUDA backend with ``VARIANTS[variant]``'s launches patched out (module functions by name,
    ``CudaOps.<method>`` methods); "whole pass" patches nothing."""
    patches = VARIANTS[variant]
    module = {k: v for k, v in patches.items() if "." not in k and hasattr(cuda_backend, k)}
    attention = {k: v for k, v in patches.items() if "." not in k and k not in module}  # cuda_attention.py's
    ops = {k.split(".", 1)[1]: v for k, v in patches.items() if k.startswith("CudaOps.")}
    with contextlib.ExitStack() as stack:
        for target, attrs in ((cuda_backend, module), (cuda_attention, attention), (cuda_backend.CudaOps, ops)):
            if attrs:  # mock.patch.multiple refuses an empty set
                stack.enter_context(mock.patch.multiple(target, **attrs))
        yield


def plot(rows: list, path) -> None:
    """Microseconds each kind of launch costs a pass (what leaving it out saved), one bar per model."""
    from matplotlib.figure import Figure

    from hiraishin.atomic import atomic_write

    models = list(dict.fromkeys(r["model"] for r in rows))
    kinds = [v for v in dict.fromkeys(r["variant"] for r in rows) if v != "whole pass"]
    fig = Figure(figsize=(8, 3.6), layout="constrained")
    ax = fig.add_subplot()
    height = 0.8 / len(models)
    for m, model in enumerate(models):
        by = {r["variant"]: r for r in rows if r["model"] == model}
        whole = by["whole pass"]["replay_ms"]
        ys = [i + m * height for i in range(len(kinds))]
        ax.barh(ys, [1e3 * by[k]["saved_ms"] for k in kinds], height=height,
                label=f"{model.removesuffix('.gguf')} (whole pass {whole:.3f} ms)")
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(kinds))], kinds)
    ax.invert_yaxis()
    ax.axvline(0, color="black", linewidth=0.8)
    ax.set_xlabel("µs a one-token pass saves without these launches (graph replay)")
    ax.legend(loc="upper right", fontsize=8)
    order = rows[0]["order"] if rows else ""
    ax.set_title(f"What each kind of small launch costs a pass ({order})", fontsize=10)
    with atomic_write(path, "wb") as f:
        fig.savefig(f, format="png", dpi=120)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    host_overhead.add_arguments(ap, models="*")
    ap.add_argument("--plot", help="also draw the savings as a PNG")
    ap.add_argument("--variants", help="comma-separated variant names to run (default: all; the whole pass always)")
    ap.add_argument("--from-json", help="draw --plot from this earlier run's JSON instead of measuring")
    args = ap.parse_args(argv)
    if args.from_json:
        if not args.plot or args.models:
            ap.error("--from-json takes --plot and no models")
        import json

        plot(json.loads(Path(args.from_json).read_text())["rows"], args.plot)
        return 0
    if not args.models:
        ap.error("give at least one MODEL.gguf (or --from-json F --plot PNG)")
    chosen = list(VARIANTS)
    if args.variants:
        chosen = ["whole pass"] + [v.strip() for v in args.variants.split(",") if v.strip() != "whole pass"]
        unknown = [v for v in chosen if v not in VARIANTS]
        if unknown:
            ap.error(f"unknown variants {unknown}; known: {list(VARIANTS)}")
    rows = []
    for path in args.models:
        base = None
        for name in chosen:
            with ablated(name):
                r = host_overhead.measure(path, args.order, args.steps)
            ms = r["back_to_back_replay_ms"]
            base = ms if base is None else base
            rows.append({"model": r["model"], "order": r["order"], "variant": name, "replay_ms": ms,
                         "saved_ms": base - ms, "replay_s_per_step": r["replay_s_per_step"]})
            print(f"{r['model']} {name:24s} {ms:.3f} ms  (saves {1e3 * (base - ms):6.1f} us)", flush=True)
    if args.json:
        write_rows_json(args.json, rows)
    if args.plot:
        plot(rows, args.plot)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
