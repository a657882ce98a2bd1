"""The bench's parallel compile step: jobs dealt to workers, worker choices kept private."""

import json
import subprocess

from opforge.bench import prewarm


class _FakePopen:
    launched: list = []

    def __init__(self, cmd, env, stdout, stderr):
        self.cmd, self.env = cmd, env
        _FakePopen.launched.append(self)

    def wait(self):
        return 0 if json.loads(self.cmd[-1]) else 1


def test_jobs_are_dealt_round_robin_with_a_private_autotune_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("OPFORGE_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(subprocess, "Popen", _FakePopen)
    _FakePopen.launched = []
    jobs = [("softmax", "entries", i) for i in range(5)]
    assert prewarm.prewarm(jobs, 2) == 0
    dealt = [json.loads(p.cmd[-1]) for p in _FakePopen.launched]
    assert dealt == [[list(j) for j in jobs[0::2]], [list(j) for j in jobs[1::2]]]
    for p in _FakePopen.launched:
        assert p.cmd[1:3] == ["-m", "opforge.bench.prewarm"]
        assert p.env["OPFORGE_CACHE_DIR"] != str(tmp_path)  # noisy choices never reach the timed run's cache
        assert p.env["OPFORGE_PREWARM_QUICK"] == "0"


def test_more_workers_than_jobs_start_one_per_job(monkeypatch):
    monkeypatch.setattr(subprocess, "Popen", _FakePopen)
    _FakePopen.launched = []
    assert prewarm.prewarm([("scan", "entries", 0)], 8, quick=True) == 0
    assert len(_FakePopen.launched) == 1 and _FakePopen.launched[0].env["OPFORGE_PREWARM_QUICK"] == "1"


def test_a_worker_runs_its_cases_and_survives_a_bad_one(monkeypatch):
    warmed = []
    real = prewarm._warm
    monkeypatch.setattr(prewarm, "_warm", lambda case, dev: (real(case, dev), warmed.append(case.op)))
    # an index past the family's list fails; the cases after it still run (interpreter, tiny)
    prewarm.worker([("transpose", "entries", 10_000), ("transpose", "entries", 0)], quick=True)
    assert warmed == ["transpose"]
