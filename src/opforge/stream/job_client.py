"""``env.execute_async`` and its ``JobClient`` (Flink's names): the job runs
in a background thread; the client reads its status and live metrics,
cancels it, takes savepoints and waits for the ``JobExecutionResult``.

Requests (cancel, savepoints) are served between the executor's rounds, where
no record is in flight, so a savepoint is as consistent as a checkpoint and a
cancelled job leaves transactional sinks with their last committed output only.
"""

from __future__ import annotations

import itertools
import threading
import time as _time
from concurrent.futures import Future
from enum import Enum


class JobStatus(str, Enum):
    CREATED = "CREATED"
    RUNNING = "RUNNING"
    FINISHED = "FINISHED"
    CANCELED = "CANCELED"
    FAILED = "FAILED"

    def is_globally_terminal_state(self) -> bool:
        return self in (JobStatus.FINISHED, JobStatus.CANCELED, JobStatus.FAILED)


class JobCancellationException(RuntimeError):
    """What ``get_job_execution_result`` raises for a cancelled job."""


class JobControl:
    """Shared by the job's thread and its client; the executor calls
    ``attach`` once and ``at_barrier`` after every round."""

    def __init__(self):
        self.lock = threading.Lock()
        self.cancel_requested = False
        self.requests: list = []  # (directory, stop, Future)
        self.nodes = None
        self.started = None

    def attach(self, nodes, coordinator) -> None:
        self.nodes, self.started = nodes, _time.perf_counter()

    def at_barrier(self, coordinator, finished: bool = False) -> bool:
        """Serve requests; True if the job is to stop here (stop-with-savepoint)."""
        if self.cancel_requested and not finished:
            raise JobCancellationException("the job was cancelled")
        with self.lock:
            requests, self.requests = self.requests, []
        stop = False
        for directory, stop_it, fut in requests:
            if finished:
                fut.set_exception(RuntimeError("savepoint: the job finished before it could be taken"))
                continue
            try:
                fut.set_result(coordinator.savepoint(directory))
                stop = stop or stop_it
            except Exception as e:  # the job goes on; the caller sees why the savepoint failed
                fut.set_exception(e)
        return stop

    def fail_pending(self, exc: BaseException) -> None:
        with self.lock:
            requests, self.requests = self.requests, []
        for _, _, fut in requests:
            fut.set_exception(RuntimeError(f"savepoint: the job ended first ({exc!r})"))


_ids = itertools.count(1)


class JobClient:
    def __init__(self, env, transformations, job_name: str, restore_from=None, allow_non_restored_state=False):
        from opforge.stream.executor import run_job

        self.job_name = job_name
        self.job_id = f"job-{next(_ids)}"
        self.control = JobControl()
        self.status = JobStatus.CREATED
        self.result: Future = Future()
        self.transformations = transformations

        def main():
            self.status = JobStatus.RUNNING
            try:
                res = run_job(env, transformations, job_name, restore_from, self.control, allow_non_restored_state)
            except JobCancellationException as e:
                self.status = JobStatus.CANCELED
                self.control.fail_pending(e)
                self.result.set_exception(e)
            except BaseException as e:  # noqa: BLE001 - handed to the caller of the result
                self.status = JobStatus.FAILED
                self.control.fail_pending(e)
                self.result.set_exception(e)
            else:
                self.status = JobStatus.FINISHED
                self.control.fail_pending(RuntimeError("finished"))
                self.result.set_result(res)

        self.thread = threading.Thread(target=main, name=f"opforge-{self.job_id}", daemon=True)
        self.thread.start()

    def get_job_id(self) -> str:
        return self.job_id

    def get_job_status(self) -> JobStatus:
        return self.status

    def cancel(self) -> Future:
        """Ask the job to stop at its next round; the returned future is the result's."""
        self.control.cancel_requested = True
        return self.result

    def trigger_savepoint(self, savepoint_directory) -> Future:
        """A savepoint under ``savepoint_directory`` at the next round; the
        future gives its path. The job goes on."""
        return self._savepoint(savepoint_directory, False)

    def stop_with_savepoint(self, savepoint_directory) -> Future:
        """A savepoint, then the job stops (FINISHED, without draining its input)."""
        return self._savepoint(savepoint_directory, True)

    def _savepoint(self, directory, stop: bool) -> Future:
        fut: Future = Future()
        if self.status.is_globally_terminal_state():
            fut.set_exception(RuntimeError(f"savepoint: job {self.job_id} is already {self.status.value}"))
            return fut
        with self.control.lock:
            self.control.requests.append((directory, stop, fut))
        return fut

    def get_job_execution_result(self, timeout: float | None = None):
        """Wait for the job; its ``JobExecutionResult``, or the job's error."""
        return self.result.result(timeout)

    def get_metrics(self) -> dict:
        """Live metrics: per operator records in / out, and the sources'
        records per second since the job started."""
        nodes = self.control.nodes
        if nodes is None:
            return {"operators": {}, "source_records": 0, "events_per_second": 0.0, "elapsed_ms": 0.0}
        ops, source_records = {}, 0
        for n in nodes.values():
            ms = list(n.metrics)
            name = n.t.name if n.t.name not in ops else f"{n.t.name}#{n.t.id}"
            ops[name] = {"records_in": sum(m.records_in for m in ms), "records_out": sum(m.records_out for m in ms)}
            if n.t.kind == "source":
                source_records += ops[name]["records_out"]
        elapsed = (_time.perf_counter() - self.control.started) * 1000
        return {"operators": ops, "source_records": source_records,
                "events_per_second": source_records / max(elapsed, 1e-9) * 1000, "elapsed_ms": elapsed}
