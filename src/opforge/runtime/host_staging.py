"""Host arrays to the device through reused pinned staging buffers and asynchronous copies.

Why: a pageable ``tensor.to("cuda")`` makes the driver stage through its own small pinned buffer
and blocks the host for the whole copy (a fraction of the link's speed). Here each host piece is
gathered (one multi-threaded ``torch`` copy, which also does a strided gather or a dtype-preserving
copy out of Arrow memory) into one of ``SLOTS`` pinned buffers, and a side stream copies the buffer
to the device with ``non_blocking=True``: the host fills one buffer while the link drains the
other. A buffer is written again only after its copy's event has completed. The caller's stream
waits for the copies (an event), so the result is safe to use on it at once; nothing waits on
the host except for a free buffer.

``fill_to_device`` takes parts instead of pieces: ``(rows, fill)`` where ``fill(dst)`` writes the
part's values itself, on a pool thread. Each part gets a pinned buffer of its own (``threads + 1``
in flight), so the host work that produces the values (Parquet decoding, ``parquet_read``) runs in
parallel and writes once, into the memory the link reads; the copies are issued in part order as
parts finish. On the CPU the parts write straight into the result.

Without CUDA (or where pinning fails) the pieces are copied into one host tensor and moved with
``.to(device)``: the same result, no pinned memory (``pin_memory`` needs a CUDA driver).
"""
from __future__ import annotations

import threading
import warnings
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import torch

SLOT_BYTES = 32 << 20  # per buffer: large enough to run the link at full speed, small enough to pin once
SLOTS = 2
PARTS_BYTES = 256 << 20  # pinned memory for the parts in flight of ``fill_to_device``, at most (but 2 parts)
PART_BYTES_MAX = 64 << 20  # a larger part (one huge Parquet row group) goes through ``to_device``'s slots

Part = tuple[int, Callable[[np.ndarray], None]]  # (rows, fill): fill(dst) writes the part's rows into dst


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
        self.part_buffers: list[torch.Tensor] = []  # fill_parts' buffers, made on first use
        self.part_events: list = []

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

    def _part_buffers(self, nbytes: int, depth: int) -> list[int]:
        """Indices of ``depth`` part buffers of at least ``nbytes`` each (made or enlarged here)."""
        for i in range(depth):
            if i == len(self.part_buffers):
                self.part_buffers.append(torch.empty(0, dtype=torch.uint8))
                self.part_events.append(None)
            if self.part_buffers[i].numel() < nbytes:
                if self.part_events[i] is not None:
                    self.part_events[i].synchronize()
                self.part_buffers[i] = torch.empty(max(nbytes, 1 << 20), dtype=torch.uint8, pin_memory=True)
                self.part_events[i] = None
        return list(range(depth))

    def fill_parts(self, parts: Sequence[Part], n: int, dtype: torch.dtype, threads: int) -> torch.Tensor:
        out = torch.empty(n, dtype=dtype, device=self.device)
        caller = torch.cuda.current_stream(self.device)
        self.stream.wait_stream(caller)
        item = out.element_size()
        largest = max((rows for rows, _ in parts), default=0) * item
        depth = max(2, min(threads + 1, PARTS_BYTES // max(largest, 1)))
        with self.lock, ThreadPoolExecutor(threads, thread_name_prefix="staging-fill") as pool:
            free = deque(self._part_buffers(largest, depth))
            running: deque = deque()  # (future, buffer index, offset, rows), in part order

            def copy_oldest():
                future, i, at, rows = running.popleft()
                future.result()
                with torch.cuda.stream(self.stream):
                    out[at:at + rows].copy_(self.part_buffers[i][:rows * item].view(dtype), non_blocking=True)
                    self.part_events[i] = torch.cuda.Event()
                    self.part_events[i].record(self.stream)
                free.append(i)

            try:
                offset = 0
                for rows, fill in parts:
                    if not free:
                        copy_oldest()
                    i = free.popleft()
                    dst = self.part_buffers[i][:rows * item].view(dtype).numpy()
                    running.append((pool.submit(_fill_after, self.part_events[i], fill, dst), i, offset, rows))
                    offset += rows
                while running:
                    copy_oldest()
            except BaseException:
                for future, *_ in running:
                    future.cancel()
                raise
            caller.wait_stream(self.stream)
        return out


def _fill_after(event, fill, dst: np.ndarray) -> None:
    if event is not None:
        event.synchronize()  # the link has finished reading this buffer's previous part
    fill(dst)


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


def fill_to_device(parts: Sequence[Part], n: int, dtype: torch.dtype, device, threads: int) -> torch.Tensor:
    """One 1-D tensor of ``n`` values of ``dtype`` on ``device`` from ``parts`` (in order, their rows
    summing to ``n``), each filled by ``fill(dst)`` on one of ``threads`` threads; through pinned
    part buffers on CUDA, straight into the result on the CPU."""
    total = sum(rows for rows, _ in parts)
    if total != n:
        raise ValueError(f"host_staging: the parts hold {total} values, expected {n}")
    device = torch.device(device)
    staging = _staging(device) if device.type == "cuda" and torch.cuda.is_available() else None
    if staging is not None:
        return staging.fill_parts(parts, n, dtype, threads)
    out = torch.empty(n, dtype=dtype)
    dst = out.numpy()
    with ThreadPoolExecutor(threads, thread_name_prefix="staging-fill") as pool:
        futures, offset = [], 0
        for rows, fill in parts:
            futures.append(pool.submit(fill, dst[offset:offset + rows]))
            offset += rows
        try:
            for future in futures:
                future.result()
        except BaseException:
            for future in futures:
                future.cancel()
            raise
    return out if device.type == "cpu" else out.to(device)
