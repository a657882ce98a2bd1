"""Background tuning (``OPFORGE_AUTOTUNE=background``): the call never waits.

A call that meets a shape bucket with no exact entry runs at once with the
nearest bucket's config (or the heuristic), and hands the bucket to one
daemon thread, which tunes it on clones of the arguments (the caller may
change or free its tensors as soon as the call returns), on a CUDA stream of
its own. When the tuning finishes, the entry is cached and the call's
memoized decision switches to the tuned config (and is dropped from the
memo), so the next call uses it.

Bounded: one job at a time, at most ``QUEUE_LIMIT`` waiting (more are
skipped, and run with the config they have), each bucket queued once, and
arguments whose storage exceeds ``OPFORGE_AUTOTUNE_CLONE_MB`` (default 256;
on a GPU also at most a quarter of its free memory) are not cloned nor tuned.
Nothing is queued while the calling stream captures a CUDA graph. The worker
itself cannot see another thread's capture: call :func:`drain` before
capturing a graph, or tune offline (``opforge tune``).
"""

from __future__ import annotations

import os
import queue
import threading
import warnings
from dataclasses import dataclass
from typing import Any, Callable

import torch

QUEUE_LIMIT = 64
DEFAULT_CLONE_MB = 256


@dataclass
class Job:
    op: Any  # registry.Op
    variant: Any  # registry.Variant
    args: tuple  # clones of the call's arguments
    key_text: str  # the TuneKey's text: one job per bucket
    on_done: Callable[[Any], None]  # called with the stored TuneEntry
    ready: Any = None  # a CUDA event recorded after the clones were made


_queue: "queue.Queue[Job]" = queue.Queue(maxsize=QUEUE_LIMIT)
_queued: set[str] = set()
_lock = threading.Lock()
_worker: threading.Thread | None = None
skipped: dict[str, str] = {}  # key text -> why it was not queued (explain, tests)


def clone_budget_bytes(device: torch.device | None) -> int:
    budget = int(float(os.environ.get("OPFORGE_AUTOTUNE_CLONE_MB", DEFAULT_CLONE_MB)) * (1 << 20))
    if device is not None and device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        budget = min(budget, free // 4)
    return budget


def _tensors(obj) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []


def _clone(obj):
    """A copy of ``obj`` with every tensor (also inside lists and tuples) copied
    storage and all, so sizes, strides, offset and overlap stay as they were:
    the clone has the caller's memo key and shape bucket."""
    if isinstance(obj, torch.Tensor):
        storage = obj.untyped_storage().clone()
        return torch.empty(0, dtype=obj.dtype, device=obj.device).set_(
            storage, obj.storage_offset(), obj.size(), obj.stride())
    if isinstance(obj, tuple):
        return tuple(_clone(item) for item in obj)
    if isinstance(obj, list):
        return [_clone(item) for item in obj]
    return obj


def submit(op, variant, args: tuple, key_text: str, on_done: Callable[[Any], None]) -> str | None:
    """Queue ``variant``'s tuning for ``args``'s bucket; None when queued, else why not."""
    from opforge.runtime import autotune

    with _lock:
        if key_text in _queued:
            return "already queued"
    tensors = _tensors(args)
    device = tensors[0].device if tensors else None
    if not autotune.can_benchmark(tensors):
        return _skip(key_text, "the stream is capturing a CUDA graph")
    need = sum(t.untyped_storage().nbytes() for t in tensors)
    budget = clone_budget_bytes(device)
    if need > budget:
        return _skip(key_text, f"arguments of {need >> 20} MiB exceed the clone budget of {budget >> 20} MiB "
                               f"(OPFORGE_AUTOTUNE_CLONE_MB)")
    try:
        with torch.no_grad():
            clones = _clone(args)
    except Exception as e:  # a tensor without plain storage (sparse, ...): left to offline tuning
        return _skip(key_text, f"arguments cannot be cloned ({type(e).__name__}: {e})")
    ready = None
    if device is not None and device.type == "cuda":
        ready = torch.cuda.Event()
        ready.record()
    job = Job(op, variant, clones, key_text, on_done, ready)
    with _lock:
        if key_text in _queued:
            return "already queued"
        try:
            _queue.put_nowait(job)
        except queue.Full:
            return _skip(key_text, f"{QUEUE_LIMIT} buckets are already waiting")
        _queued.add(key_text)
        _start()
    return None


def _skip(key_text: str, why: str) -> str:
    skipped[key_text] = why
    return why


def _start() -> None:
    global _worker
    if _worker is None or not _worker.is_alive():
        from opforge.runtime.device import interpret_mode

        if interpret_mode():
            _one_grid_at_a_time()
        _worker = threading.Thread(target=_work, name="opforge-autotune", daemon=True)
        _worker.start()


def _one_grid_at_a_time() -> None:
    """Under the Triton interpreter, grids run one at a time across threads. Why: the interpreter
    patches ``triton.language`` for the duration of a grid (``_patch_lang``) and restores it after,
    so a tuning grid ending beside the caller's grid unpatched it mid-run ("Did you forget to add
    @triton.jit?"). The caller's grids and the worker's then take turns."""
    from triton.runtime import interpreter

    executor = interpreter.GridExecutor
    if getattr(executor.__call__, "opforge_serialized", False):
        return
    run, lock = executor.__call__, threading.RLock()

    def call(self, *args, **kwargs):
        with lock:
            return run(self, *args, **kwargs)

    call.opforge_serialized = True
    executor.__call__ = call


def _work() -> None:
    streams: dict[int, torch.cuda.Stream] = {}
    while True:
        job = _queue.get()
        try:
            _tune(job, streams)
        except Exception as e:  # a job that fails is dropped; the calls keep the config they have
            if os.environ.get("OPFORGE_DEBUG"):
                warnings.warn(f"opforge: background tuning of {job.op.qualname} {job.variant.name} failed: {e!r}")
        finally:
            with _lock:
                _queued.discard(job.key_text)
            _queue.task_done()


def _tune(job: Job, streams: dict) -> None:
    from opforge.runtime import autotune

    tensors = _tensors(job.args)
    if job.ready is None:
        entry = autotune.tune(job.op, job.variant, job.args)
    else:
        device = tensors[0].device
        with torch.cuda.device(device):
            index = torch.cuda.current_device()
            stream = streams.setdefault(index, torch.cuda.Stream(device))
            with torch.cuda.stream(stream):
                stream.wait_event(job.ready)
                entry = autotune.tune(job.op, job.variant, job.args)
            stream.synchronize()  # the clones are freed after this: no kernel may still read them
    job.args = ()
    if entry is not None:
        job.on_done(entry)


def drain(timeout: float | None = None) -> bool:
    """Wait until every queued bucket is tuned; False if ``timeout`` seconds passed first."""
    with _queue.all_tasks_done:
        return _queue.all_tasks_done.wait_for(lambda: _queue.unfinished_tasks == 0, timeout)


def pending() -> int:
    return _queue.unfinished_tasks
