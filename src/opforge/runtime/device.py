"""What hardware we run on, and whether Triton kernels can run on it.

Every decision downstream (dispatch, tuning keys, bench ceilings) reads the
device through this module, so there is one answer to "which GPU is this".
"""

from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch


def interpret_mode() -> bool:
    """True when ops must run their Triton kernels under the interpreter.

    Tests set ``OPFORGE_INTERPRET=1``; we mirror it into ``TRITON_INTERPRET``,
    which Triton reads when a kernel is first decorated.
    """
    return os.environ.get("OPFORGE_INTERPRET", "0") not in ("", "0", "false", "off")


@functools.lru_cache(maxsize=None)
def triton_available() -> bool:
    try:
        import triton  # noqa: F401
    except Exception:
        return False
    return True


@dataclass(frozen=True)
class DeviceInfo:
    """Facts about one device, as the tuning key and the reports need them."""

    type: str  # "cuda" or "cpu"
    index: int
    name: str
    sm_count: int
    capability: tuple[int, int]
    memory_bytes: int
    l2_bytes: int

    @property
    def arch(self) -> str:
        return f"sm_{self.capability[0]}{self.capability[1]}" if self.type == "cuda" else "cpu"


@functools.lru_cache(maxsize=None)
def device_info(device: torch.device | str | None = None) -> DeviceInfo:
    dev = torch.device(device) if device is not None else default_device()
    if dev.type == "cuda":
        index = dev.index if dev.index is not None else torch.cuda.current_device()
        p = torch.cuda.get_device_properties(index)
        return DeviceInfo(
            "cuda",
            index,
            p.name,
            p.multi_processor_count,
            (p.major, p.minor),
            p.total_memory,
            getattr(p, "L2_cache_size", 0),
        )
    return DeviceInfo("cpu", 0, "cpu", os.cpu_count() or 1, (0, 0), 0, 0)


def default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def capability(device: torch.device) -> tuple[int, int]:
    return device_info(device).capability


def driver_version() -> str:
    """The NVIDIA driver version, or "" when there is none."""
    if not torch.cuda.is_available():
        return ""
    try:
        import ctypes

        lib = ctypes.CDLL("libnvidia-ml.so.1")
        lib.nvmlInit_v2()
        buf = ctypes.create_string_buffer(96)
        lib.nvmlSystemGetDriverVersion(buf, 96)
        return buf.value.decode()
    except Exception:
        return ""


def versions() -> dict[str, str]:
    from opforge.version import __version__

    out = {"opforge": __version__, "torch": torch.__version__, "cuda": torch.version.cuda or ""}
    try:
        import triton

        out["triton"] = triton.__version__
    except Exception:
        out["triton"] = ""
    out["driver"] = driver_version()
    return out
