"""Process-group setup from torchrun's environment, and device meshes.

``torchrun --nproc-per-node N script.py`` starts N processes and gives each
``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR`` and ``MASTER_PORT``.
:func:`init` reads them, picks the backend (NCCL when this host has a GPU per
local rank, Gloo otherwise), binds the rank to its GPU and forms the default
group with a timeout, so a rank that never arrives is an error after
``timeout`` seconds instead of a hang. Everything else in ``opforge.distributed``
takes ``group=None`` (the default group) or a sub-group from :func:`mesh`.

Timeouts: Gloo raises on the waiting ranks when a peer exits or the timeout
passes (turned into :class:`~opforge.distributed.errors.CollectiveError`); NCCL's
watchdog aborts the process group after the timeout, which ends the ranks.
"""

from __future__ import annotations

import datetime
import math
import os
from dataclasses import dataclass

import torch
import torch.distributed as dist

from opforge.distributed.errors import SetupError

WHERE = "opforge.distributed.init"
LAUNCH_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
BACKENDS = ("nccl", "gloo")
DEFAULT_TIMEOUT_S = 300.0

_timeout_s: float | None = None  # the default group's timeout, for error messages


@dataclass(frozen=True)
class RankInfo:
    """Where this process sits: its rank, the group size, its local rank and device."""

    rank: int
    world_size: int
    local_rank: int
    backend: str
    device: torch.device


def _env_int(name: str) -> int:
    raw = os.environ[name]
    try:
        return int(raw)
    except ValueError:
        raise SetupError(f"{WHERE}: environment variable {name}={raw!r} is not an integer") from None


def _timeout(timeout) -> float:
    if timeout is None:
        raw = os.environ.get("OPFORGE_DIST_TIMEOUT")
        try:
            timeout = float(raw) if raw else DEFAULT_TIMEOUT_S
        except ValueError:
            raise SetupError(f"{WHERE}: OPFORGE_DIST_TIMEOUT={raw!r} is not a number of seconds") from None
    if isinstance(timeout, datetime.timedelta):
        timeout = timeout.total_seconds()
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ValueError(f"{WHERE}: timeout must be a positive number of seconds, got {timeout!r}")
    return float(timeout)


def default_backend() -> str:
    """NCCL when CUDA and NCCL are both here, else Gloo."""
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def init(backend: str | None = None, *, timeout: float | datetime.timedelta | None = None) -> RankInfo:
    """Form the default process group from torchrun's environment (idempotent).

    ``backend``: ``"nccl"``, ``"gloo"`` or None (:func:`default_backend`).
    ``timeout``: seconds (default ``$OPFORGE_DIST_TIMEOUT`` or 300) for the
    rendezvous and for every collective after it.
    """
    global _timeout_s
    if dist.is_initialized():
        return info()
    missing = [v for v in LAUNCH_ENV if v not in os.environ]
    if missing:
        raise SetupError(f"{WHERE}: {', '.join(missing)} not set; launch with "
                         f"`torchrun --nproc-per-node N script.py` (it sets {', '.join(LAUNCH_ENV)} and LOCAL_RANK)")
    rank, world = _env_int("RANK"), _env_int("WORLD_SIZE")
    if world < 1 or not 0 <= rank < world:
        raise SetupError(f"{WHERE}: RANK={rank} and WORLD_SIZE={world}: expected 0 <= RANK < WORLD_SIZE")
    local = _env_int("LOCAL_RANK") if "LOCAL_RANK" in os.environ else rank
    backend = default_backend() if backend is None else backend
    if backend not in BACKENDS:
        raise ValueError(f"{WHERE}: backend must be one of {BACKENDS} or None, got {backend!r}")
    seconds = _timeout(timeout)
    device_id = None
    if backend == "nccl":
        count = torch.cuda.device_count()
        if count == 0:
            raise SetupError(f"{WHERE}: backend 'nccl' needs CUDA GPUs and none is visible; use backend='gloo'")
        if local >= count:
            raise SetupError(f"{WHERE}: LOCAL_RANK={local} but only {count} GPU(s) are visible; start at most "
                             f"{count} processes per host (torchrun --nproc-per-node {count})")
        device_id = torch.device("cuda", local)
        torch.cuda.set_device(device_id)
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=seconds), world_size=world,
                                rank=rank, device_id=device_id, pg_options=_nccl_options(backend))
    except (RuntimeError, TimeoutError) as e:  # DistStoreError: a rank never joined the rendezvous
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise SetupError(f"{WHERE}: rank {rank} of {world} could not form the group within {seconds:g} s "
                         f"(a rank missing, or MASTER_ADDR/MASTER_PORT differ between ranks). "
                         f"Backend said: {first}") from e
    _timeout_s = seconds
    return info()


def _nccl_options(backend: str):
    """NCCL on high-priority streams: a collective overlapped with a GEMM gets SMs as soon as
    any free up, ahead of the GEMM's tiles still queued (PyTorch's ``is_high_priority_stream``)."""
    if backend != "nccl":
        return None
    opts = dist.ProcessGroupNCCL.Options()
    opts.is_high_priority_stream = True
    return opts


# Called before the group goes: what holds NCCL work (captured CUDA graphs) must go first,
# or tearing the communicators down waits on it.
before_destroy: list = []


def destroy() -> None:
    """Tear down the default group (a no-op when none)."""
    global _timeout_s
    if dist.is_initialized():
        for release in before_destroy:
            release()
        dist.destroy_process_group()
    _timeout_s = None


def _require(where: str) -> None:
    if not dist.is_initialized():
        raise SetupError(f"{where}: no process group; call opforge.distributed.init() first (under torchrun)")


def rank(group=None, *, where: str = "opforge.distributed.rank") -> int:
    _require(where)
    return dist.get_rank(group)


def world_size(group=None, *, where: str = "opforge.distributed.world_size") -> int:
    _require(where)
    return dist.get_world_size(group)


def backend(group=None) -> str:
    _require("opforge.distributed.backend")
    return str(dist.get_backend(group)).lower()


def device(group=None) -> torch.device:
    """The device a group's collectives take tensors on: this rank's GPU under NCCL, the CPU under Gloo."""
    if backend(group) == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def timeout_s() -> float | None:
    """The default group's timeout in seconds (None when it was not formed by :func:`init`)."""
    return _timeout_s


def info(group=None) -> RankInfo:
    """This process's :class:`RankInfo` in ``group``."""
    _require("opforge.distributed.info")
    local = int(os.environ.get("LOCAL_RANK", dist.get_rank()))
    return RankInfo(dist.get_rank(group), dist.get_world_size(group), local, backend(group), device(group))


def mesh(shape: tuple[int, ...] | int, names: tuple[str, ...] | None = None):
    """A ``torch.distributed.device_mesh.DeviceMesh`` over all ranks, row-major.

    ``mesh((2, 4), ("dp", "tp"))`` on 8 ranks: ranks 0-3 form the first tp
    group; ``mesh_group(m, "tp")`` is this rank's tp group. Collective: every
    rank calls it with the same arguments.
    """
    where = "opforge.distributed.mesh"
    shape = (shape,) if isinstance(shape, int) else tuple(shape)
    if not shape or any(not isinstance(s, int) or isinstance(s, bool) or s < 1 for s in shape):
        raise ValueError(f"{where}: shape must be positive integers, got {shape!r}")
    world = world_size(where=where)
    if math.prod(shape) != world:
        raise ValueError(f"{where}: shape {shape} holds {math.prod(shape)} ranks but the group has {world}")
    if names is not None:
        names = tuple(names)
        if len(names) != len(shape) or len(set(names)) != len(names) or not all(isinstance(n, str) for n in names):
            raise ValueError(f"{where}: names must be {len(shape)} distinct strings (one per mesh dim), got {names!r}")
    from torch.distributed.device_mesh import init_device_mesh

    return init_device_mesh(device(None).type, shape, mesh_dim_names=names)


def mesh_group(m, dim: int | str = 0):
    """The process group of this rank along one dim of a mesh from :func:`mesh`."""
    names = m.mesh_dim_names or ()
    if isinstance(dim, str) and dim not in names:
        raise ValueError(f"opforge.distributed.mesh_group: the mesh has dims {names}, not {dim!r}")
    if isinstance(dim, int) and not 0 <= dim < m.ndim:
        raise ValueError(f"opforge.distributed.mesh_group: dim {dim} is out of range for a {m.ndim}-D mesh")
    return m.get_group(dim)
