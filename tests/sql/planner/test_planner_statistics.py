"""Column statistics against numpy / pandas computed independently: exact counts, min/max, NULLs and
most-common values on small columns; HyperLogLog within its error bound on large ones."""
import numpy as np
import pyarrow as pa
import pytest
import torch

from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.planner import statistics as S
from opforge.sql.table import Table


def _col(values, valid=None):
    t = torch.as_tensor(values)
    return Column(t, None if valid is None else torch.as_tensor(valid), T.FLOAT64 if t.is_floating_point() else T.INT64)


def test_exact_statistics_of_a_small_column():
    rng = np.random.default_rng(0)
    v = rng.integers(-50, 200, 5000)
    valid = rng.random(5000) > 0.1
    st = S.column_stats(_col(v, valid))
    kept = v[valid]
    assert st.rows == 5000 and st.nulls == int((~valid).sum())
    assert (st.min, st.max) == (kept.min(), kept.max())
    assert st.exact and st.distinct == len(np.unique(kept))
    assert st.null_fraction == pytest.approx((~valid).mean())


def test_most_common_values_find_the_heavy_hitters():
    rng = np.random.default_rng(1)
    keys = rng.zipf(1.5, 50000) % 1000  # skewed: a few keys hold most rows
    st = S.column_stats(_col(keys))
    values, counts = np.unique(keys, return_counts=True)
    top = values[np.argsort(-counts)][: len(st.mcv)]
    assert [v for v, _ in st.mcv] == [float(x) for x in top]
    for v, f in st.mcv:
        assert f == pytest.approx((keys == v).mean())
    assert st.frequency(st.mcv[0][0]) == st.mcv[0][1]
    assert st.heavy_hitters(0.1) == [(v, f) for v, f in st.mcv if f > 0.1] and st.heavy_hitters(0.1)
    # a value outside [min, max] never occurs; an unlisted one gets the rest spread evenly
    assert st.frequency(st.max + 1) == 0.0
    uniform = S.column_stats(_col(np.arange(5000) % 100))
    assert uniform.mcv == [] and uniform.frequency(7) == pytest.approx(0.01)


@pytest.mark.parametrize("distinct", [100, 3000, 200000])
def test_hyperloglog_within_its_error_bound(distinct):
    rng = np.random.default_rng(distinct)
    values = torch.from_numpy(np.unique(rng.integers(0, 10 ** 12, distinct)))
    values = values[torch.from_numpy(rng.integers(0, len(values), 300000))]  # repeats
    truth = len(torch.unique(values))
    est = S.hyperloglog(values)
    # standard error 1.04 / sqrt(4096) = 1.6 %; 4 sigma
    assert abs(est - truth) / truth < 0.065


def test_large_columns_use_hyperloglog_and_sampled_mcvs():
    rng = np.random.default_rng(3)
    v = np.concatenate([rng.integers(0, 100000, 200000), np.full(50000, 7)])
    st = S.column_stats(_col(v), exact_rows=1 << 14)
    truth = len(np.unique(v))
    assert not st.exact and abs(st.distinct - truth) / truth < 0.065
    assert st.mcv[0][0] == 7 and st.mcv[0][1] == pytest.approx(0.2 + 1 / 100000 * 0.8, rel=0.1)
    assert len(st.mcv) == 1  # the uniform rest is not "common" (sample noise is filtered out)


def test_floats_hash_by_value_and_strings_by_code():
    st = S.column_stats(_col(np.array([0.0, -0.0, 1.5, 1.5, np.inf])), exact_rows=0)
    assert round(st.distinct) == 3
    t = Table.from_arrow(pa.table({"s": ["b", "a", None, "b", "c"], "n": [None] * 5}), "cpu")
    ts = S.table_stats(t)
    s = ts.columns["s"]
    assert ts.rows == 5 and s.nulls == 1 and s.distinct == 3 and s.dictionary == ("a", "b", "c")
    assert (s.min, s.max) == (0.0, 2.0)  # codes: dictionary order is string order
    empty = ts.columns["n"]
    assert empty.nulls == 5 and empty.min is None and empty.distinct == 0


def test_hyperloglog_rejects_a_bad_precision():
    with pytest.raises(ValueError, match="hyperloglog: precision"):
        S.hyperloglog(torch.arange(10), precision=30)
    assert S.hyperloglog(torch.zeros(0, dtype=torch.int64)) == 0.0


def test_like_fraction_matches_the_rows_and_is_memoized(monkeypatch):
    import fnmatch

    import opforge.sql.expr as E

    rng = np.random.default_rng(4)
    words = [f"w{i:04d}{'green' if i % 7 == 0 else 'red'}" for i in range(3000)]
    few = pa.table({"s": rng.choice(["green tea", "red wine", "greenish"], 4000).tolist()})
    many = pa.table({"s": words + [None] * 1000})
    for table, pattern in ((few, "%green%"), (many, "%green%"), (many, "w00%")):
        s = table.column("s").to_pylist()
        st = S.table_stats(Table.from_arrow(table, "cpu")).columns["s"]
        truth = sum(v is not None and fnmatch.fnmatchcase(v, pattern.replace("%", "*")) for v in s) / len(s)
        assert st.like_fraction(pattern, sample_words=10 ** 6) == pytest.approx(truth)
        # a coarse sample stays near the truth; the first answer for a pattern is reused
        monkeypatch.setattr(E, "like_regex", lambda p: (_ for _ in ()).throw(AssertionError("recomputed")))
        assert st.like_fraction(pattern, sample_words=10) == pytest.approx(truth)
        monkeypatch.undo()


def test_a_key_check_computes_only_itself_and_is_exact(monkeypatch):
    """``unique`` (asked of every scanned column) is proved exactly, sampled or not, without the
    distinct count or most-common values, which are computed when first read."""
    monkeypatch.setattr(S, "MCV_SAMPLE_ROWS", 1 << 10)  # a sample of every 19th row
    rng = np.random.default_rng(3)
    keys = rng.permutation(20_000)  # unsorted, every value once: the whole column is checked
    one_repeat = keys.copy()
    one_repeat[12_346] = one_repeat[7]  # the sample misses the repeat
    flags = rng.integers(0, 3, 20_000)  # the sample refutes it
    valid = np.ones(20_000, dtype=bool)
    valid[5] = False
    cases = [(keys, None, True), (one_repeat, None, False), (flags, None, False), (keys, valid, False),
             (np.array([], dtype=np.int64), None, False)]
    for values, mask, want in cases:
        st = S.column_stats(_col(values, mask), exact_rows=1 << 10)
        assert st.unique is want
        assert not {"distinct", "exact", "mcv", "min", "max"} & set(vars(st))
        assert st.rows == len(values) and st.nulls == (0 if mask is None else int((~mask).sum()))
    assert st.distinct == 0 and set(vars(st)) >= {"distinct", "exact", "mcv"}
