"""The price of exactness, in one table and one plot, from committed GPU results (no new timing).

    python bench/price_of_exactness.py bench/results/2026-12-01-h200-engine2/hiraishin-bench.json \\
        --matvec bench/results/2026-12-01-h200-mmq/run1/bench_mmq.json --out bench/results/2026-12-01-h200-engine2

``--matvec newest``: the committed ``bench_mmq.json`` (under ``bench/results``) with the latest date it records,
of the bench's own card where one exists.

Reads a ``hiraishin bench`` JSON (whole verify passes of the synthetic Qwen3-8B per order and width,
exact speculative speed-ups) and, optionally, a ``bench/bench_mmq.py`` JSON (per-shape mat-vec µs of
the sub-block order's kernels against ``BATCH_VARIANT``'s one-column kernel; with ``--all-orders``, every
order's mat-vec at every width 1..16), and writes ``price-of-exactness.json`` (rows of order, width, ms;
the mat-vec rows; the speed-ups), a PNG of the passes (and ``price-of-exactness-matvec.png``, µs per shape,
order and width, when the mat-vec JSON has every order) and a Markdown table. Every number is copied from
the input files, which are named in the output, the mat-vec tables with the card, date and commit of their own
run (said to be another card's when it is).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from hiraishin.atomic import atomic_path, atomic_write  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results"


def newest_matvec(device: str, root: Path = RESULTS) -> Path | None:
    """The ``bench_mmq.json`` under ``root`` whose run is the latest (its recorded date) on ``device``, else
    the latest on any card; None when there is none."""
    runs = []
    for path in sorted(root.rglob("bench_mmq.json")):
        try:
            d = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise SystemExit(f"{path}: not a readable bench_mmq JSON ({e})") from None
        runs.append((d.get("device") == device, str(d.get("date", "")), path))
    return max(runs)[2] if runs else None


def build(bench: dict, mmq: dict | None, sources: list[str]) -> dict:
    rows = [{"order": name, "width": int(w), "ms": float(ms), "x_one_token": float(ms) / o["verify_ms"]["1"]}
            for name, o in bench["orders"].items() for w, ms in sorted(o["verify_ms"].items(), key=lambda i: int(i[0]))]
    matvec, matvec_orders = [], []
    if mmq is not None:
        for r in mmq["results"]:
            if r["kernel"] == "variant-mmvq" or r["kernel"].startswith("mmq-"):  # the library's launches (onecol,
                # dp4a, mma); not bench_mmq.py's "other-mmq-*" rows, the one-column form the library does not pick
                matvec.append({"shape": r["shape"], "qtype": r["qtype"], "order": "batch_variant" if r["kernel"] ==
                               "variant-mmvq" else "subblock", "ncols": r["ncols"], "us": r["time_us"],
                               "x_variant_one_col": r["ratio_to_variant_one_col"]})
            elif r["kernel"] == "order-matvec":  # bench_mmq.py --all-orders
                matvec_orders.append({"shape": r["shape"], "qtype": r["qtype"], "order": r["order"],
                                      "ncols": r["ncols"], "us": r["time_us"],
                                      "x_variant_one_col": r["ratio_to_variant_one_col"],
                                      "bits_equal_width16": r["bits_equal_width16"]})
    spec = {name: {k: s[k] for k in ("speedup", "plain_ms_per_token", "speculative_ms_per_token", "matches_plain",
                                     "first_divergence") if k in s}
            for name, s in bench["speculative"].items()}
    run = None if mmq is None else {k: mmq.get(k, "?") for k in ("device", "date", "commit")}
    return {"schema": "hiraishin-price-of-exactness/1", "device": bench["device"].get("name", "?"),
            "date": bench["date"], "commit": bench.get("commit", "?"), "model": bench["model"]["name"],
            "sources": sources, "derived": "copied from the sources; no new measurement",
            "rows": rows, "matvec": matvec, "matvec_orders": matvec_orders, "matvec_run": run, "speculative": spec}


def matvec_origin(poe: dict) -> str:
    """Where the mat-vec rows were timed: the card, date and commit of their own run, and whether that card is
    not the passes' card."""
    run = poe.get("matvec_run") or {}
    text = f"timed on {run.get('device', '?')}, {str(run.get('date', '?'))[:10]}, commit {run.get('commit', '?')}"
    if run.get("device") != poe["device"]:
        text += f"; another card than the passes above ({poe['device']}): compare within this table only"
    return text


def plot(poe: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hiraishin.decode.plot import plot_verify_cost

    verify = {}  # order -> {width: ms}, in the rows' order
    for r in poe["rows"]:
        verify.setdefault(r["order"], {})[r["width"]] = r["ms"]
    fig = plot_verify_cost(verify, f"price of exactness: a verify pass against its width ({poe['device']}, "
                                   f"{poe['date'][:10]}, commit {poe['commit']})",
                           ylabel="ms per pass (synthetic Qwen3-8B)")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def plot_matvec(poe: dict, path: Path) -> None:
    """µs of each order's mat-vec against its width, one panel per Qwen3-8B shape."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = poe["matvec_orders"]
    shapes = list(dict.fromkeys(r["shape"] for r in rows))
    fig, axes = plt.subplots(1, len(shapes), figsize=(3.4 * len(shapes), 3.4), layout="constrained", squeeze=False)
    for ax, shape in zip(axes[0], shapes):
        for order in dict.fromkeys(r["order"] for r in rows):
            pts = sorted((r["ncols"], r["us"]) for r in rows if r["shape"] == shape and r["order"] == order)
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=order)
        ax.axvline(8.5, color="k", ls=":", lw=1)
        ax.set_title(shape, fontsize=9)
        ax.set_xlabel("columns")
        ax.set_xticks([1, 4, 8, 12, 16])
    axes[0][0].set_ylabel("µs per mat-vec launch(es)")
    axes[0][-1].legend(fontsize="small", title="order")
    run = poe.get("matvec_run") or {}
    fig.suptitle(f"price of exactness per mat-vec ({run.get('device', '?')}, {str(run.get('date', '?'))[:10]}, "
                 f"commit {run.get('commit', '?')})", fontsize=10)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=120, format="png")
    plt.close(fig)


def markdown(poe: dict) -> str:
    orders = list(dict.fromkeys(r["order"] for r in poe["rows"]))
    widths = sorted({r["width"] for r in poe["rows"]})
    ms = {(r["order"], r["width"]): r["ms"] for r in poe["rows"]}
    lines = [f"# Price of exactness — {poe['device']}, {poe['date'][:10]}, commit {poe['commit']}", "",
             f"Copied from: {', '.join(poe['sources'])} (no new measurement).", "",
             "Whole verify pass of the synthetic Qwen3-8B (ms), CUDA graphs on:", "",
             "| width | " + " | ".join(orders) + " |", "|---|" + "---|" * len(orders)]
    for w in widths:
        lines.append(f"| {w} | " + " | ".join(f"{ms[(o, w)]:.2f}" for o in orders) + " |")
    def _spec(o, s):  # a run whose tokens left plain decoding's is not exact speculation: say where
        if s.get("matches_plain", True) is False:
            return f"{o} {s['speedup']:.2f}x (tokens differ from plain decoding from token {s.get('first_divergence')})"
        return f"{o} {s['speedup']:.2f}x"

    lines += ["", "Speculative decoding (oracle schedule, 8B target, 0.6B draft): " + ", ".join(
        _spec(o, s) for o, s in poe["speculative"].items()) + "."]
    if poe["matvec"]:
        lines += ["", f"Mat-vec µs per Qwen3-8B shape (`batch_variant` 1 column; `subblock` at 1 / 3 / 9 / 16 columns; "
                  f"{matvec_origin(poe)}):",
                  "", "| shape | variant 1 | subblock 1 | 3 | 9 | 16 |", "|---|---|---|---|---|---|"]
        for shape in dict.fromkeys(r["shape"] for r in poe["matvec"]):
            get = {(r["order"], r["ncols"]): r["us"] for r in poe["matvec"] if r["shape"] == shape}
            cells = [get.get(("batch_variant", 1))] + [get.get(("subblock", n)) for n in (1, 3, 9, 16)]
            lines.append(f"| {shape} | " + " | ".join("-" if c is None else f"{c:.1f}" for c in cells) + " |")
    if poe.get("matvec_orders"):
        rows = poe["matvec_orders"]
        orders = list(dict.fromkeys(r["order"] for r in rows))
        lines += ["", "Every order's mat-vec as a forward pass launches it, µs per width (`fixed_split`'s is "
                  f"`batch_invariant`'s; * = a column's bits differ from the same column at width 16; {matvec_origin(poe)}):"]
        for shape in dict.fromkeys(r["shape"] for r in rows):
            get = {(r["order"], r["ncols"]): r for r in rows if r["shape"] == shape}
            lines += ["", f"**{shape}**", "", "| width | " + " | ".join(orders) + " |", "|---|" + "---|" * len(orders)]
            for w in sorted({r["ncols"] for r in rows if r["shape"] == shape}):
                cells = [get.get((o, w)) for o in orders]
                lines.append(f"| {w} | " + " | ".join("-" if c is None else f"{c['us']:.1f}"
                                                        + ("" if c["bits_equal_width16"] else "*") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("bench_json")
    p.add_argument("--matvec", help="a bench/bench_mmq.py JSON, or 'newest': the latest committed one (the bench's "
                                    "card first)")
    p.add_argument("--out", required=True, help="folder for price-of-exactness.{json,png,md}")
    a = p.parse_args(argv)
    bench = json.loads(Path(a.bench_json).read_text())
    matvec, name = (Path(a.matvec), a.matvec) if a.matvec and a.matvec != "newest" else (None, None)
    if a.matvec == "newest" and (matvec := newest_matvec(bench["device"].get("name", "?"))) is not None:
        name = str(matvec.relative_to(RESULTS.parents[1]))  # named from the repository root
    mmq = json.loads(matvec.read_text()) if matvec else None
    poe = build(bench, mmq, [a.bench_json] + ([name] if name else []))
    out = Path(a.out)
    with atomic_write(out / "price-of-exactness.json") as f:
        json.dump(poe, f, indent=1)
    plot(poe, out / "price-of-exactness.png")
    if poe["matvec_orders"]:
        plot_matvec(poe, out / "price-of-exactness-matvec.png")
    with atomic_write(out / "price-of-exactness.md") as f:
        f.write(markdown(poe))
    print(f"wrote {out}/price-of-exactness.{{json,png,md}}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
