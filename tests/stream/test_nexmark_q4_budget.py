"""Nexmark q4's columnar operators (``WinningBidsOperator``, ``RunningAverageOperator``)
under a state budget (``env.set_state_budget``): open auctions, waiting bids and
category totals over ``device_bytes`` wait in host memory and Arrow files, come
back before they are needed (a bid's auction, an auction's waiting bids, the
auctions a watermark closes, a batch's categories), and the outputs — records,
order, timestamps — are those of the job without a budget and of the
record-at-a-time forms; checkpoints hold every tier."""

import os

import pytest
import torch

import opforge.stream.nexmark as nexmark
from opforge.stream import FileSink, StateBudget, StreamExecutionEnvironment
from opforge.stream.keys import KeySelector
from opforge.stream.nexmark import NexmarkConfig, RunningAverageOperator, WinningBidsOperator, q4
from opforge.stream.records import Batch
from stream_helpers import record_cold_rows, run_with_failures, simulated_env
from test_columnar_joins import _Boom, _FailAt, _rows, lagging_source
from test_columnar_joins import nexmark as run_q4
from test_nexmark_queries import check_q4

TINY = (2048, 4096)  # device, host bytes per subtask


def files_under(path):
    return [os.path.join(d, f) for d, _, fs in os.walk(path) for f in fs]


@pytest.fixture
def tiers(monkeypatch):
    """Every ColdRows a q4 operator makes during the test (their counters: spills, evictions, restores)."""
    return record_cold_rows(monkeypatch, nexmark)


def of(tiers, kind):
    return [c for c in tiers if kind in c.name]


def engine(config, batch_size, budget=None, parallelism=2, source=None):
    # batch granularity: at record granularity q4 closes auctions at every watermark its records saw,
    # fetching cold rows each time (minutes here); q4 at record granularity: test_columnar_joins
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size,
                                     watermark_granularity="batch")
    if budget is not None:
        env.set_state_budget(*budget)
    sink = (q4(env, config) if source is None else q4(env, config, source=source)).collect()
    env.execute("q4")
    return list(zip(sink.records(), sink.timestamps()))


# events a few tens of seconds long: auctions (open 10 to 30 s) close mid-stream
CONFIGS = {1: NexmarkConfig(events=5000, events_per_second=250, max_out_of_orderness_ms=300, auctions_in_flight=30,
                            seed=1),
           7: NexmarkConfig(events=5000, events_per_second=200, max_out_of_orderness_ms=300, auctions_in_flight=30,
                            seed=7),
           1000: NexmarkConfig(events=40_000, events_per_second=500, max_out_of_orderness_ms=300, seed=3)}


@pytest.mark.parametrize("batch_size", [1, 7, 1000])
def test_q4_under_a_tiny_budget_gives_the_same_output(batch_size, tmp_path, tiers):
    config = CONFIGS[batch_size]
    spill = tmp_path / "spill"
    want = engine(config, batch_size)
    assert len(want) > 100
    record_form, _ = run_q4(q4, config, False, 2, batch_size, watermark_granularity="batch")
    assert want == record_form  # the columnar operators equal their record forms (records, times, order)
    check_q4([r for r, _ in want], config)  # and pandas
    counts = {}
    budgets = [(*TINY, spill), (0,)] + ([(0, 0, spill), (512, 1024, spill)] if batch_size > 1 else [])
    for budget in budgets:
        tiers.clear()
        assert engine(config, batch_size, budget) == want, budget
        assert tiers and all(len(c) == 0 and c.host is None for c in tiers)  # nothing left behind
        assert files_under(spill) == [], budget  # every spill file deleted by the job's end
        for kind in ("auctions", "early-bids", "Average"):
            cs = of(tiers, kind)
            assert cs, kind
            counts[budget, kind] = (sum(c.spilled_files for c in cs), sum(c.evicted_rows for c in cs),
                                    sum(c.restored_rows for c in cs))
    spilled, evicted, restored = counts[(*TINY, spill), "auctions"]
    assert spilled > 0 and evicted > 0 and restored > 0  # auctions went cold, to disk, and came back
    for budget in budgets[1:3]:  # every category evicted after each batch, brought back by the next
        spilled, evicted, restored = counts[budget, "Average"]
        assert evicted > 0 and restored > 0 and (spilled > 0) == (budget != (0,))
        assert counts[budget, "auctions"][1] > 0 and (counts[budget, "auctions"][0] > 0) == (budget != (0,))


def test_q4_bids_before_their_auctions_under_a_budget(tmp_path, tiers):
    """Auctions come rounds late: the bids waiting for them go cold and come back with their auctions."""
    config = NexmarkConfig(events=15_000, events_per_second=1000, max_out_of_orderness_ms=200, seed=4)
    source = lagging_source(config, lag_rounds=3, batch=150)
    want = engine(config, 100, source=source)
    assert want == run_q4(q4, config, False, 2, 100, source, watermark_granularity="batch")[0]
    check_q4([r for r, _ in want], config)
    spill = tmp_path / "spill"
    for budget in [(*TINY, spill), (0, 0, spill)]:
        tiers.clear()
        assert engine(config, 100, budget, source=source) == want, budget
        early = of(tiers, "early-bids")
        assert sum(c.spilled_files for c in early) > 0 and sum(c.restored_rows for c in early) > 0
        assert files_under(spill) == []


# -- the operators alone -------------------------------------------------------------

class _Out:
    def __init__(self):
        self.batches = []

    def emit(self, batch):
        self.batches.append(batch)

    def emit_watermark(self, watermark):
        pass


def _operator(make, budget):
    op = make()
    op.setup(None, 0, 1, None, torch.device("cpu"))
    op.state_budget = budget
    op.open()
    op.out = _Out()
    return op


def _winning_bids():
    keys = KeySelector("id")
    keys.space.identity = True  # int auction ids are their own key ids
    return WinningBidsOperator("wb", keys)


def _auctions(ids, start, expires, category=11):
    t = torch.tensor(start, dtype=torch.int64)
    cols = {"id": torch.tensor(ids), "seller": torch.zeros(len(ids), dtype=torch.int64),
            "category": torch.full((len(ids),), category), "date_time": t,
            "expires": torch.tensor(expires, dtype=torch.int64)}
    return Batch(cols, t, None, keys=torch.tensor(ids))


def _bids(auctions, prices, times):
    t = torch.tensor(times, dtype=torch.int64)
    cols = {"auction": torch.tensor(auctions), "bidder": torch.zeros(len(auctions), dtype=torch.int64),
            "price": torch.tensor(prices), "date_time": t}
    return Batch(cols, t, None, keys=torch.tensor(auctions))


def _winners(op):
    if not op.out.batches:
        return []
    out = Batch.concat(op.out.batches)
    return list(zip(out["auction"].tolist(), out["price"].tolist(), out.timestamps.tolist()))


def test_bids_and_the_watermark_open_only_the_files_they_need(tmp_path):
    """Every row on disk (budget 0, 0): a bid batch reads the files whose id
    range holds its auction; a watermark reads those whose earliest expiry it
    passed, brings back exactly the auctions it closes and closes them."""
    op = _operator(_winning_bids, StateBudget(0, 0, str(tmp_path)))
    for i in range(5):  # auctions 10i .. 10i + 2, expiring at 1000 (i + 1) + j: one file each
        ids = [10 * i + j for j in range(3)]
        op.process_input(_auctions(ids, [i] * 3, [1000 * (i + 1) + j for j in range(3)]), 0)
    auctions = op.cold[0]
    assert len(op.auctions) == 0 and len(auctions.files) == 5 and len(files_under(tmp_path)) == 5
    others = [f["path"] for f in auctions.files if f["kmin"] != 20]
    op.process_input(_bids([21, 22], [50, 60], [100, 5000]), 1)  # 22's bid is after it expires: not valid
    assert auctions.restored_rows == 2  # 21 and 22 came back; 20 (read with them) stayed cold, on disk
    assert [f["path"] for f in auctions.files][:4] == others  # only [20, 22]'s file was read
    assert len(op.auctions) == 0 and len(auctions) == 15  # back to the host / disk after the batch
    op.on_watermark(2001)  # closes 0, 1, 2 (expire 1000 .. 1002) and 10, 11 (2000, 2001)
    assert auctions.restored_rows == 2 + 5 and len(auctions) == 10
    # files 0 and 1 were read; 12, not closed, went back to disk (host budget 0), as 20 and then 21, 22 did
    assert {f["kmin"] for f in auctions.files} == {12, 20, 21, 30, 40} and auctions.host is None
    assert _winners(op) == []  # no valid bid: no winner
    op.process_input(_bids([12, 40], [7, 9], [1500, 2500]), 1)
    op.on_watermark(3002)  # closes 12 (2002) and 20 .. 22 (3000 .. 3002): by expiry
    assert _winners(op) == [(12, 7, 2002), (21, 50, 3001)]
    op.on_watermark(10_000)
    assert _winners(op) == [(12, 7, 2002), (21, 50, 3001), (40, 9, 5000)] and len(auctions) == 0
    op.dispose()
    assert files_under(tmp_path) == []


def _feed_winning_bids(op):
    """Auctions, bids before and after their auctions, and watermarks that close some."""
    for i in range(8):
        ids = [200 - 4 * i - j for j in range(4)]  # ids fall as auctions arrive: arrival order is not id order
        op.process_input(_bids([a - 4 for a in ids], [i * 10 + j for j in range(4)], [50 * i + 55] * 4), 1)
        op.process_input(_auctions(ids, [50 * i] * 4, [50 * i + 120 + 7 * j for j in range(4)]), 0)
        op.process_input(_bids(ids[::-1], [i * 7 + j for j in range(4)], [50 * i + 30 + j for j in range(4)]), 1)
        if i % 3 == 2:
            op.on_watermark(50 * i)
    for first in (900, 950):  # bids whose auctions never come, waiting in two batches (part of them cold)
        op.process_input(_bids(list(range(first, first + 4)), [1, 2, 3, 4], [500, 501, 502, 503]), 1)


def _feed_average(op):
    for i in range(6):
        cats = [(i * j) % 5 + 10 for j in range(6)]
        cols = {"auction": torch.arange(6), "category": torch.tensor(cats), "price": torch.arange(6) * 10 + i}
        op.process_batch(Batch(cols, torch.full((6,), i, dtype=torch.int64), None, keys=torch.tensor(cats)))


def _listed(state):
    def flat(v):
        if isinstance(v, torch.Tensor):
            return v.tolist()
        if isinstance(v, dict):
            return {k: flat(x) for k, x in sorted(v.items())}
        return v

    return flat(state)


@pytest.mark.parametrize("which", ["winning-bids", "average"])
def test_a_checkpoint_holds_every_tier_in_the_order_without_a_budget(which, tmp_path):
    """``snapshot_state`` with rows cold equals the state of the same operator
    without a budget; a restore under a budget applies it again."""
    make, feed = ((_winning_bids, _feed_winning_bids) if which == "winning-bids"
                  else (lambda: RunningAverageOperator("avg"), _feed_average))
    budget = StateBudget(0, 64, str(tmp_path)) if which == "average" else StateBudget(300, 400, str(tmp_path))
    plain = _operator(make, None)
    feed(plain)
    cold = _operator(make, budget)
    feed(cold)
    colds = cold.cold if isinstance(cold.cold, list) else [cold.cold]
    assert all(len(c) > 0 for c in colds) and sum(c.spilled_files for c in colds) > 0  # every table partly cold
    assert plain.out.batches  # some auctions closed with a winner
    assert _listed(cold.snapshot_state()) == _listed(plain.snapshot_state())
    assert [_listed(b.columns) for b in cold.out.batches] == [_listed(b.columns) for b in plain.out.batches]
    restored = _operator(make, budget)
    restored.restore_state(plain.snapshot_state())
    rcolds = restored.cold if isinstance(restored.cold, list) else [restored.cold]
    assert sum(len(c) for c in rcolds) > 0  # the budget applies again after a restore
    assert _listed(restored.snapshot_state()) == _listed(plain.snapshot_state())
    for op in (cold, restored):
        op.dispose()
    assert files_under(tmp_path) == []


def test_running_average_evicts_the_categories_updated_longest_ago(tmp_path):
    op = _operator(lambda: RunningAverageOperator("avg"), StateBudget(64, 0, str(tmp_path)))  # 2 rows of 32 bytes

    def batch(cats, prices):
        cols = {"category": torch.tensor(cats), "price": torch.tensor(prices)}
        op.process_batch(Batch(cols, torch.zeros(len(cats), dtype=torch.int64), None, keys=torch.tensor(cats)))

    for c in (1, 2, 3, 4):
        batch([c], [10 * c])
    assert op.keys.tolist() == [3, 4] and len(op.cold) == 2
    batch([1, 1], [30, 50])  # category 1 back from disk: its file alone is read
    assert op.cold.restored_rows == 1 and op.keys.tolist() == [1, 4]
    out = op.out.batches[-1]
    assert out["avg"].tolist() == [20.0, 30.0] and out["auctions"].tolist() == [2, 3]
    op.dispose()
    assert files_under(tmp_path) == []


# -- checkpoints --------------------------------------------------------------------------

def test_q4_under_a_budget_survives_a_failure_and_restore(tmp_path, tiers, monkeypatch):
    """Kill and restore twice, with a budget: the output is the failure-free run's
    without a budget (checkpoints taken while rows were cold gathered every tier)."""
    config = NexmarkConfig(events=12_000, events_per_second=200, max_out_of_orderness_ms=300, auctions_in_flight=30,
                           seed=2)
    spill = tmp_path / "spill"
    cold_at_snapshot = []
    snapshot = WinningBidsOperator.snapshot_state

    def recording(self):
        if self.cold is not None:
            cold_at_snapshot.append(sum(len(c) for c in self.cold))
        return snapshot(self)

    monkeypatch.setattr(WinningBidsOperator, "snapshot_state", recording)

    def build(env, out, fail_at):
        q4(env, config).map(_FailAt(fail_at)).set_parallelism(1).sink_to(FileSink(out / "q", "json"))

    plain = simulated_env(64)
    build(plain, tmp_path / "plain", None)
    plain.execute()
    want = _rows(tmp_path / "plain" / "q")
    assert len(want) > 200
    tiers.clear()
    ref, out = run_with_failures(lambda: simulated_env(64, (*TINY, spill)), build, tmp_path / "budget", (40, 250), _Boom)
    assert _rows(ref / "q") == want and _rows(out / "q") == want
    assert sum(c.spilled_files for c in tiers) > 0 and sum(c.restored_rows for c in tiers) > 0
    assert any(cold_at_snapshot)  # some checkpoint was taken with auctions or bids cold
    assert files_under(spill) == []
