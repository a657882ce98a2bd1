"""Errors of the distributed layer, and the translation of backend failures into them.

Gloo and NCCL report a dead or missing peer as a bare ``RuntimeError`` from
deep inside the backend (``pair.cc:553 Connection closed by peer``). The
engines above need to know *which* operation failed, on which rank, and
whether a peer is gone or late, so every collective here runs inside
:func:`collective`, which re-raises with that context.
"""

from __future__ import annotations

from contextlib import contextmanager


class DistError(RuntimeError):
    """Base of the errors raised by ``opforge.distributed``."""


class SetupError(DistError):
    """The process group could not be formed: launch environment wrong, or a rank never joined."""


class CollectiveError(DistError):
    """A collective failed on this rank: a peer exited, or did not answer within the timeout."""


def _reason(message: str) -> str:
    low = message.lower()
    if "timed out" in low or "timeout" in low:
        return "timed out waiting for a peer (a rank is missing, stuck, or called a different collective)"
    if "closed by peer" in low or "connection reset" in low or "broken pipe" in low or "crash" in low:
        return "a peer rank exited (crashed or was killed) before finishing it"
    return "the backend reported an error"


@contextmanager
def collective(where: str, what: str, rank: int, world: int, timeout_s: float | None):
    """Run one collective; a backend ``RuntimeError`` becomes a :class:`CollectiveError`
    that names the operation, this rank, the group size and the timeout."""
    try:
        yield
    except DistError:
        raise
    except RuntimeError as e:  # DistBackendError, DistNetworkError and plain backend errors
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        limit = f"{timeout_s:g} s" if timeout_s is not None else "the backend default"
        raise CollectiveError(f"{where}: {what} across {world} ranks failed on rank {rank}: {_reason(str(e))} "
                              f"(timeout {limit}). Backend said: {first}") from e
