"""The columnar window path's device grouping and table lookup: order-preserving
pair codes (dense table or one sort), ``find_pairs``, the ``nonzero`` with a
known count — against ``torch.unique`` and the generic path — and the window
operator on keys too wide for the codes (the fallback) and on the syncless
sliding-window assignment."""

import pytest
import torch

from opforge.stream import (Aggregations, SlidingEventTimeWindows, StreamExecutionEnvironment,
                            TumblingEventTimeWindows, WatermarkStrategy)
from opforge.stream.grouping import find_pairs, group_codes, group_pairs, nonzero_known, pair_codes
from stream_helpers import multiset, out_of_order_events


@pytest.mark.parametrize("seed", range(6))
def test_pair_codes_group_like_torch_unique(seed):
    g = torch.Generator().manual_seed(seed)
    n = int(torch.randint(1, 3000, (1,), generator=g))
    kspan = [3, 50, 5000, 10**7][seed % 4]  # dense table (small ranges) and sort (wide ones)
    slide, offset = 7, 3
    a = torch.randint(-kspan, kspan, (n,), generator=g)
    b = torch.randint(-40, 40, (n,), generator=g) * slide + offset
    bounds = (int(a.min()), int(a.max()), int(b.min()), int(b.max()))
    codes, span = pair_codes(a, b, bounds, slide)
    assert codes is not None
    rng = (bounds[1] - bounds[0] + 1) * span
    for code_range in (rng, None):  # direct-address table, then the sort
        uniq, inv = group_codes(codes, code_range)
        ua = torch.div(uniq, span, rounding_mode="floor")
        got_u = torch.stack([ua + bounds[0], (uniq - ua * span) * slide + bounds[2]], 1)
        want_u, want_inv = torch.unique(torch.stack([a, b], 1), dim=0, return_inverse=True)
        assert torch.equal(got_u, want_u) and torch.equal(inv, want_inv)


def test_pair_codes_refuse_ranges_past_62_bits():
    a = torch.tensor([-(2**62), 2**62])
    b = torch.tensor([0, 1000])
    assert pair_codes(a, b, (-(2**62), 2**62, 0, 1000), 1) == (None, 0)


@pytest.mark.parametrize("wide", [False, True])
def test_find_pairs_matches_a_dict(wide):
    g = torch.Generator().manual_seed(1)
    scale = 2**61 if wide else 20  # wide: the union-grouping fallback
    tk = torch.randint(-20, 20, (300,), generator=g) * (scale // 20)
    ts = torch.randint(0, 9, (300,), generator=g) * 5
    pairs = list(dict.fromkeys(zip(tk.tolist(), ts.tolist())))
    tk, ts = torch.tensor([p[0] for p in pairs]), torch.tensor([p[1] for p in pairs])
    qk = torch.randint(-22, 22, (200,), generator=g) * (scale // 20)
    qs = torch.randint(0, 10, (200,), generator=g) * 5
    found, row = find_pairs(tk, ts, qk, qs, 5)
    where = {p: i for i, p in enumerate(pairs)}
    for i, p in enumerate(zip(qk.tolist(), qs.tolist())):
        assert bool(found[i]) == (p in where)
        if p in where:
            assert int(row[i]) == where[p]
    assert find_pairs(tk[:0], ts[:0], qk, qs, 5)[0].sum() == 0


def test_nonzero_known():
    m = torch.tensor([False, True, True, False, True])
    assert nonzero_known(m, 3).tolist() == [1, 2, 4]
    assert nonzero_known(m[:0], 0).numel() == 0


def test_sliding_assign_without_mask_is_the_same():
    ts = torch.tensor([-7, 0, 5, 19, 20, 1234, 99])
    for size, slide, offset in [(60, 20, 0), (60, 20, 7), (40, 40, 3)]:
        a = SlidingEventTimeWindows.of(size, slide, offset)
        rows, starts, ends = a.assign(ts)
        want = [(i, w.start, w.end) for i, t in enumerate(ts.tolist()) for w in a.assign_one(t)]
        got = list(zip(rows.tolist(), starts.tolist(), ends.tolist()))
        assert sorted(got) == sorted(want) and got == sorted(got, key=lambda x: x[0])


@pytest.mark.parametrize("assigner", [TumblingEventTimeWindows.of(30), SlidingEventTimeWindows.of(40, 10)])
def test_window_on_keys_too_wide_for_codes(assigner):
    """Keys spread over the whole int64 range: the operator takes the
    two-sort grouping and the union lookup, with the same results."""
    events = out_of_order_events(500, keys=7, bound=15, seed=2, late=0.0)
    wide = [((k - 3) * (2**61), v, t) for k, v, t in events]

    def run(evs):
        env = StreamExecutionEnvironment(parallelism=2, batch_size=24)
        strategy = WatermarkStrategy.for_bounded_out_of_orderness(15).with_timestamp_assigner("f2")
        sink = env.from_collection(evs, strategy).key_by(0).window(assigner) \
            .aggregate(Aggregations(with_window=True, n=("count",), total=("sum", "f1"))).collect()
        env.execute()
        return sink.records()

    narrow, spread = run(events), run(wide)
    assert len(narrow) == len(spread) > 20
    back = [{**r, "key": r["key"] // (2**61) + 3} for r in spread]
    assert multiset(back) == multiset(narrow)
