"""Restart strategies (Flink's ``RestartStrategies``): what ``execute`` does
when the job fails. Without one (or with ``no_restart()``) the failure
propagates. With ``fixed_delay_restart(n, delay)`` the job restarts up to
``n`` times; with ``failure_rate_restart(max_failures, interval, delay)``
it restarts until more than ``max_failures`` failures fall within
``interval`` ms. A restart waits ``delay`` ms of the job's clock (a
``SimulatedClock`` advances instead of sleeping), then resumes from the
latest completed checkpoint of ``env.enable_checkpointing``'s directory, or
from the start without one (Flink's semantics: output since that checkpoint
is produced again; exactly-once sinks commit it once).
"""

from __future__ import annotations

import time as _time
from dataclasses import dataclass

from opforge.stream.time import SimulatedClock, _millis


@dataclass(frozen=True)
class RestartStrategy:
    kind: str  # "none", "fixed_delay" or "failure_rate"
    attempts: int = 0
    delay_ms: int = 0
    interval_ms: int = 0

    def allows(self, failures_ms: list[int]) -> bool:
        """Whether the job may restart after the failures at these times (the last: now)."""
        if self.kind == "fixed_delay":
            return len(failures_ms) <= self.attempts
        if self.kind == "failure_rate":
            now = failures_ms[-1]
            return sum(1 for t in failures_ms if now - t < self.interval_ms) <= self.attempts
        return False


def _count(n, where: str) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 0:
        raise ValueError(f"{where}: expected a non-negative int, got {n!r}")
    return n


class RestartStrategies:
    """PyFlink's ``RestartStrategies`` builders (delays in ms or a timedelta)."""

    @staticmethod
    def no_restart() -> RestartStrategy:
        return RestartStrategy("none")

    @staticmethod
    def fall_back_restart() -> RestartStrategy:
        return RestartStrategy("none")

    @staticmethod
    def fixed_delay_restart(restart_attempts: int, delay_between_attempts) -> RestartStrategy:
        where = "RestartStrategies.fixed_delay_restart"
        return RestartStrategy("fixed_delay", _count(restart_attempts, where),
                               _millis(delay_between_attempts, where))

    @staticmethod
    def failure_rate_restart(failure_rate: int, failure_interval, delay_interval) -> RestartStrategy:
        where = "RestartStrategies.failure_rate_restart"
        return RestartStrategy("failure_rate", _count(failure_rate, where), _millis(delay_interval, where),
                               _millis(failure_interval, where))


def run_restarting(env, run, restore_from):
    """``run(restore_from)`` under ``env``'s restart strategy; the result
    notes how many restarts it took (``JobExecutionResult.restarts``)."""
    strategy = getattr(env, "restart_strategy", None)
    failures: list[int] = []
    while True:
        try:
            result = run(restore_from)
            result.restarts = len(failures)
            return result
        except Exception:
            failures.append(env.clock.now())
            if strategy is None or not strategy.allows(failures):
                raise
        if isinstance(env.clock, SimulatedClock):
            env.clock.advance(strategy.delay_ms)
        elif strategy.delay_ms:
            _time.sleep(strategy.delay_ms / 1000)
        cfg = getattr(env, "checkpoint_config", None)
        restore_from = None if cfg is None else cfg.checkpoint_dir
