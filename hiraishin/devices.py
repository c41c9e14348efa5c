"""Device facts that reduction plans depend on.

A batch-variant plan depends on the GPU: llama.cpp's mat-vec warp table is
keyed by architecture, and split-KV attention sizes its parallel blocks from
the SM count and the occupancy of the kernel it launches. On a GPU these facts
come from the driver (:func:`current_device`); on the CPU a named
:class:`DeviceProfile` supplies recorded numbers, so the emulator can replay a
given GPU's variant plan.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Mapping

from .errors import BackendError, PlanError

__all__ = ["DeviceProfile", "PROFILES", "get_profile", "current_device", "DEFAULT_PROFILE"]


@dataclass(frozen=True)
class DeviceProfile:
    """What a plan needs to know about a GPU.

    ``occupancy`` maps a hiraishin kernel name (for example ``"fattn_vec_q1"``)
    to the number of its blocks that fit on one SM, as
    ``cudaOccupancyMaxActiveBlocksPerMultiprocessor`` reports for *our*
    compiled kernels. ``mmvq_table`` names llama.cpp's mat-vec parameter table
    (``GENERIC`` for Pascal to Hopper and consumer Blackwell).
    """

    name: str
    compute_capability: int
    sm_count: int
    occupancy: Mapping[str, int] = field(default_factory=dict)
    mmvq_table: str = "GENERIC"
    source: str = ""

    def __post_init__(self):
        object.__setattr__(self, "occupancy", MappingProxyType(dict(self.occupancy)))

    def __hash__(self) -> int:
        # plans are cached per profile; the occupancy mapping is read-only, so hash its items
        return hash((self.name, self.compute_capability, self.sm_count, tuple(sorted(self.occupancy.items())),
                     self.mmvq_table))

    def blocks_per_sm(self, kernel: str) -> int:
        """Recorded occupancy of ``kernel``; a :class:`PlanError` names a missing one."""
        try:
            return self.occupancy[kernel]
        except KeyError:
            raise PlanError(
                f"device profile {self.name!r} has no occupancy for kernel {kernel!r}; "
                f"known: {sorted(self.occupancy)}"
            ) from None


# Occupancy of hiraishin's own attention kernels (blocks per SM, D=128), as the
# driver reported it for our NVRTC-compiled kernels on an H200 on 2026-11-29
# (bench/results/: fattn_vec_q1 110 registers -> 4, fattn_vec_qn 145 -> 3,
# fattn_tile 107 -> 4). llama.cpp's own vec kernels get 3 and 2 (reference
# section 1); ours use fewer registers.
_H200_OCCUPANCY = {"fattn_vec_q1": 4, "fattn_vec_qn": 3, "fattn_tile": 4}

PROFILES: dict[str, DeviceProfile] = {
    "h200": DeviceProfile(
        name="h200",
        compute_capability=900,
        sm_count=132,
        occupancy=_H200_OCCUPANCY,
        source="NVIDIA H200 SXM, 132 SMs; occupancy measured 2026-11-29 (bench/results/)",
    ),
    "rtx5060-laptop": DeviceProfile(
        name="rtx5060-laptop",
        compute_capability=1200,
        sm_count=26,
        occupancy=_H200_OCCUPANCY,
        source="GeForce RTX 5060 Laptop GPU (the original report's card), 26 SMs; "
        "occupancy assumed equal to the H200's (same 64K registers per SM), not measured",
    ),
}

DEFAULT_PROFILE = "h200"


def get_profile(name: str | DeviceProfile | None = None) -> DeviceProfile:
    """Look up a recorded profile by name (``None`` gives the default, ``h200``)."""
    if isinstance(name, DeviceProfile):
        return name
    key = DEFAULT_PROFILE if name is None else name
    try:
        return PROFILES[key]
    except KeyError:
        raise PlanError(f"unknown device profile {key!r}; known: {sorted(PROFILES)}") from None


def current_device(occupancy: Mapping[str, int] | None = None) -> DeviceProfile:
    """Profile of the current CUDA device, read from the driver through CuPy.

    ``occupancy`` is filled in by the caller that knows the compiled kernels (the CUDA backend,
    through ``hiraishin.kernels.attention.launch.measure_occupancy``).
    """
    try:
        import cupy
    except ImportError as exc:  # pragma: no cover - exercised only without CuPy
        raise BackendError("current_device() needs CuPy and a CUDA GPU") from exc
    dev = cupy.cuda.Device()
    props = cupy.cuda.runtime.getDeviceProperties(dev.id)
    cc = int(props["major"]) * 100 + int(props["minor"]) * 10
    name = props["name"].decode() if isinstance(props["name"], bytes) else str(props["name"])
    return DeviceProfile(
        name=name,
        compute_capability=cc,
        sm_count=int(props["multiProcessorCount"]),
        occupancy=dict(occupancy or {}),
        mmvq_table=_mmvq_table_for(cc),
        source="read from the driver",
    )


def _mmvq_table_for(cc: int) -> str:
    # llama.cpp get_device_table_id for NVIDIA (reference section 4.2).
    if 750 <= cc < 800:
        return "TURING"
    if cc == 1210:
        return "GB10"
    return "GENERIC"
