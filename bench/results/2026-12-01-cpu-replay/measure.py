"""Time the public replay command on the CPU backend: a warm-up run (Numba compiles or loads its
cache; a 4-token replay compiles the same functions), then RUNS measured runs; wall and CPU seconds of the whole process (``/usr/bin/time``), the
replay's own seconds (its report, model load excluded), and the load average before and after.

    python bench/results/2026-12-01-cpu-replay/measure.py LABEL [RUNS] > LABEL.json

The installed ``hiraishin`` runs; with HIRAISHIN_TREE=DIR the checkout in DIR does instead
(``python -S -P -m hiraishin`` with DIR and this environment's site-packages on PYTHONPATH, so that
an editable install of another checkout does not take over).
"""

from __future__ import annotations

import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

MODEL = Path(tempfile.gettempdir()) / "hiraishin-cpu-replay" / "qwen3-0.6b.gguf"
# 64 positions: token ids 100, 107, ..., 541 (any ids; the synthetic model has no real vocabulary)
IDS = ",".join(str(100 + 7 * i) for i in range(64))
TREE = os.environ.get("HIRAISHIN_TREE")
PYTHON = [sys.executable, "-S", "-P"] if TREE else [sys.executable]  # -P: not the current directory first
CLI = [*PYTHON, "-m", "hiraishin"] if TREE else ["hiraishin"]
ENV = os.environ | ({"PYTHONPATH": os.pathsep.join([TREE, *[p for p in sys.path if p.endswith("site-packages")]])}
                    if TREE else {})
SYNTH = [*CLI, "synth", "--shape", "qwen3-0.6b", "--seed", "0", "-o", str(MODEL), "--quiet"]
REPLAY = [*CLI, "replay", str(MODEL), "-p", f"ids:{IDS}", "-n", "0", "--device", "cpu",
          "--batch-sizes", "2,3,5,9,16"]
WARMUP = [*CLI, "replay", str(MODEL), "-p", "ids:100,107,114,121", "-n", "0", "--device", "cpu",
          "--batch-sizes", "2,3,5,9,16"]


def loadavg() -> list[float]:
    return [float(x) for x in Path("/proc/loadavg").read_text().split()[:3]]


def timed(cmd: list[str]) -> dict:
    t0 = time.time()
    p = subprocess.run(["/usr/bin/time", "-f", "TIME %e %U %S %M", *cmd], check=False, capture_output=True,
                       text=True, env=ENV)
    if p.returncode:
        raise SystemExit(f"{' '.join(cmd)} failed:\n{p.stdout}\n{p.stderr}")
    wall, user, sys_, rss = re.search(r"TIME (\S+) (\S+) (\S+) (\S+)", p.stderr).groups()
    m = re.search(r"^([\d.]+) s \((.*)\)$", p.stdout, re.MULTILINE)
    return {"started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(t0)), "wall_s": float(wall),
            "cpu_s": round(float(user) + float(sys_), 2), "user_s": float(user), "sys_s": float(sys_),
            "max_rss_kib": int(rss), "replay_s": float(m.group(1)),
            "replay_phases_s": {k: float(v) for k, v in re.findall(r"(\w+) ([\d.]+) s", m.group(2))},
            "bit_identical": "every logit is bit-identical" in p.stdout}


def main() -> None:
    label = sys.argv[1]
    runs = int(sys.argv[2]) if len(sys.argv) > 2 else 3
    if not MODEL.exists():
        MODEL.parent.mkdir(parents=True, exist_ok=True)
        subprocess.run(SYNTH, check=True, env=ENV, stdout=subprocess.DEVNULL)
    probe = subprocess.run([*PYTHON, "-c", "import hiraishin; print(hiraishin.__file__)"], check=True,
                           capture_output=True, text=True, env=ENV)
    tree = Path(probe.stdout.strip()).parents[1]
    commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"], check=False,
                            capture_output=True, text=True).stdout.strip() or os.environ.get("HIRAISHIN_COMMIT", "?")
    cpu = re.search(r"model name\s*:\s*(.*)", Path("/proc/cpuinfo").read_text()).group(1)
    out = {"label": label, "tree": str(tree), "commit": os.environ.get("HIRAISHIN_COMMIT", commit),
           "command": " ".join(REPLAY).replace(" ".join(CLI), "hiraishin"),
           "warmup_command": " ".join(WARMUP).replace(" ".join(CLI), "hiraishin"), "model": " ".join(SYNTH), "nproc": os.cpu_count(), "cpu_model": cpu,
           "python": platform.python_version(), "numba_threads": os.environ.get("NUMBA_NUM_THREADS", "default"),
           "warmup": None, "runs": []}
    la = loadavg()
    out["warmup"] = timed(WARMUP) | {"loadavg_before": la, "loadavg_after": loadavg()}
    for _ in range(runs):
        la = loadavg()
        out["runs"].append(timed(REPLAY) | {"loadavg_before": la, "loadavg_after": loadavg()})
    best = min(out["runs"], key=lambda r: r["wall_s"])
    out["best_wall_s"], out["best_cpu_s"] = best["wall_s"], min(r["cpu_s"] for r in out["runs"])
    out["best_replay_s"] = min(r["replay_s"] for r in out["runs"])
    json.dump(out, sys.stdout, indent=1)
    print()


if __name__ == "__main__":
    main()
