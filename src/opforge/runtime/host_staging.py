"""Host arrays to the device through reused pinned staging buffers and asynchronous copies.

Why: a pageable ``tensor.to("cuda")`` makes the driver stage through its own small pinned buffer
and blocks the host for the whole copy (a fraction of the link's speed). Here each host piece is
gathered (one multi-threaded ``torch`` copy, which also does a strided gather or a dtype-preserving
copy out of Arrow memory) into one of ``SLOTS`` pinned buffers, and a side stream copies the buffer
to the device with ``non_blocking=True``: the host fills one buffer while the link drains the
other. A buffer is written again only after its copy's event has completed. The caller's stream
waits for the copies (an event), so the result is safe to use on it at once; nothing waits on
the host except for a free buffer.

Without CUDA (or where pinning fails) the pieces are copied into one host tensor and moved with
``.to(device)``: the same result, no pinned memory (``pin_memory`` needs a CUDA driver).
"""
from __future__ import annotations

import threading
import warnings
from collections.abc import Iterable

import numpy as np
import torch

SLOT_BYTES = 32 << 20  # per buffer: large enough to run the link at full speed, small enough to pin once
SLOTS = 2


def torch_dtype(np_dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype."""
    return torch.from_numpy(np.empty(0, dtype=np_dtype)).dtype


def values_view(array, np_dtype) -> np.ndarray:
    """A read-only numpy view (no copy) of a fixed-width Arrow array's values buffer, read as
    ``np_dtype`` (values under NULLs are whatever the buffer holds)."""
    return np.frombuffer(array.buffers()[1], dtype=np_dtype, count=array.offset + len(array))[array.offset:]


def _as_tensor(piece) -> torch.Tensor:
    """A host piece (numpy array, possibly strided or read-only Arrow memory) as a CPU tensor
    without copying."""
    if isinstance(piece, torch.Tensor):
        return piece
    with warnings.catch_warnings():  # read-only Arrow buffers: only ever read here
        warnings.simplefilter("ignore", UserWarning)
        return torch.from_numpy(np.asarray(piece))


class PinnedStaging:
    """Double-buffered pinned staging for one CUDA device (see the module doc)."""

    def __init__(self, device: torch.device, slot_bytes: int = SLOT_BYTES, slots: int = SLOTS):
        self.device = device
        self.buffers = [torch.empty(slot_bytes, dtype=torch.uint8, pin_memory=True) for _ in range(slots)]
        self.events = [None] * slots
        self.stream = torch.cuda.Stream(device)
        self.next = 0
        self.lock = threading.Lock()  # one user at a time: the buffers are shared

    def copy(self, pieces: Iterable, n: int, dtype: torch.dtype) -> torch.Tensor:
        out = torch.empty(n, dtype=dtype, device=self.device)
        caller = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(caller)  # ``out`` was allocated on the caller's stream
        item = out.element_size()
        per_slot = max(1, self.buffers[0].numel() // item)
        offset = 0
        with self.lock:
            for piece in pieces:
                src = _as_tensor(piece).reshape(-1)
                for lo in range(0, src.shape[0], per_slot):
                    part = src[lo:lo + per_slot]
                    m = part.shape[0]
                    i, self.next = self.next, (self.next + 1) % len(self.buffers)
                    if self.events[i] is not None:
                        self.events[i].synchronize()  # the link has finished reading this buffer
                    stage = self.buffers[i][:m * item].view(dtype)
                    stage.copy_(part)
                    with torch.cuda.stream(self.stream):
                        out[offset:offset + m].copy_(stage, non_blocking=True)
                        self.events[i] = torch.cuda.Event()
                        self.events[i].record(self.stream)
                    offset += m
            if offset != n:
                raise ValueError(f"host_staging: the pieces hold {offset} values, expected {n}")
            caller.wait_stream(self.stream)
        return out


_STAGING: dict[torch.device, PinnedStaging | None] = {}


def _staging(device: torch.device) -> PinnedStaging | None:
    """The staging buffers of a CUDA device, made on first use; None when pinning is unavailable."""
    if device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    if device not in _STAGING:
        try:
            _STAGING[device] = PinnedStaging(device)
        except RuntimeError:  # no driver / pinning refused: the pageable path
            _STAGING[device] = None
    return _STAGING[device]


def to_device(pieces: Iterable, n: int, dtype: torch.dtype, device) -> torch.Tensor:
    """One 1-D tensor of ``n`` values of ``dtype`` on ``device`` from host pieces (numpy arrays or
    CPU tensors of that dtype, in order), through pinned staging on CUDA."""
    device = torch.device(device)
    staging = _staging(device) if device.type == "cuda" and torch.cuda.is_available() else None
    if staging is not None:
        return staging.copy(pieces, n, dtype)
    out = torch.empty(n, dtype=dtype)
    offset = 0
    for piece in pieces:
        src = _as_tensor(piece).reshape(-1)
        out[offset:offset + src.shape[0]].copy_(src)
        offset += src.shape[0]
    if offset != n:
        raise ValueError(f"host_staging: the pieces hold {offset} values, expected {n}")
    return out if device.type == "cpu" else out.to(device)
