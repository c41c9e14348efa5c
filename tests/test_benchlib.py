"""bench/benchlib.py: the capture of a chain (one uncaptured warm-up step, then every step inside the capture) and the
device name."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))


class _FakeStream:
    """Records what a chain capture does to a CUDA stream."""

    def __init__(self):
        self.log = []

    def __enter__(self):
        self.log.append("enter")
        return self

    def __exit__(self, *exc):
        self.log.append("exit")

    def synchronize(self):
        self.log.append("sync")

    def begin_capture(self):
        self.log.append("begin")

    def end_capture(self):
        self.log.append("end")
        return "graph"


def test_capture_chain_warms_up_then_captures_every_step_in_order():
    from benchlib import capture_chain

    stream = _FakeStream()
    graph = capture_chain(stream, lambda i: stream.log.append(i), 3, pdl=False)
    assert graph == "graph"
    assert stream.log == ["enter", 0, "sync", "begin", 0, 1, 2, "end", "exit"]


def test_device_name_decodes_the_driver_bytes():
    from types import SimpleNamespace

    import benchlib

    props = {"name": b"NVIDIA H200"}
    runtime = SimpleNamespace(getDeviceProperties=lambda i: props)
    cp = SimpleNamespace(cuda=SimpleNamespace(runtime=runtime, Device=lambda: SimpleNamespace(id=0)))
    assert benchlib.device_name(cp) == "NVIDIA H200"
    assert benchlib.device_name(cp, {"name": "given"}) == "given"
