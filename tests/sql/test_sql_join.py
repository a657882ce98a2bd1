"""Joins against DuckDB: duplicate keys on both sides, NULL keys never match, empty inputs, all-match,
no-match, multi-key, residual predicates, outer/semi/anti, skewed keys, join order without cross products."""
import numpy as np
import pyarrow as pa
import pytest

from sql_reference import SqlCheck


def _side(rng, n, keys, prefix, zipf=False, null_frac=0.1):
    k = (rng.zipf(1.5, n) % keys) if zipf else rng.integers(0, keys, n)
    return pa.table({
        f"{prefix}k": pa.array(k.astype(np.int64), mask=rng.random(n) < null_frac),
        f"{prefix}k2": pa.array(rng.integers(0, 3, n).astype(np.int32)),
        f"{prefix}s": pa.array([["x", "y", "z", "w"][j] for j in rng.integers(0, 4, n)], pa.string(), mask=rng.random(n) < null_frac),
        f"{prefix}v": pa.array(rng.integers(0, 100, n).astype(np.int32)),
    })


@pytest.fixture(scope="module")
def check():
    rng = np.random.default_rng(5)
    return SqlCheck({
        "a": _side(rng, 120, 15, "a"), "b": _side(rng, 90, 15, "b"),
        "z1": _side(rng, 200, 40, "a", zipf=True), "z2": _side(rng, 150, 40, "b", zipf=True),
        "e": _side(rng, 0, 5, "b"),
        "far": pa.table({"bk": pa.array([1000, 1001], pa.int64()), "bv": pa.array([1, 2], pa.int32())}),
        "same": pa.table({"bk": pa.array([7, 7, 7], pa.int64()), "bv": pa.array([1, 2, 3], pa.int32())}),
        "one": pa.table({"ak": pa.array([7, 7], pa.int64()), "av": pa.array([5, 6], pa.int32())}),
        "c": pa.table({"ck": pa.array(np.arange(15), pa.int64()), "cname": pa.array([f"n{i}" for i in range(15)])}),
    })


KINDS = ["JOIN", "LEFT JOIN", "RIGHT JOIN", "FULL JOIN"]


@pytest.mark.parametrize("kind", KINDS)
def test_equi_join_kinds(check, kind):
    check(f"SELECT * FROM a {kind} b ON ak = bk")
    check(f"SELECT * FROM a {kind} b ON ak = bk AND ak2 = bk2")
    check(f"SELECT * FROM a {kind} b ON a.as = b.bs")  # string keys with different dictionaries
    check(f"SELECT * FROM a {kind} b ON ak = bk AND av < bv")
    check(f"SELECT * FROM z1 {kind} z2 ON z1.ak = z2.bk")


@pytest.mark.parametrize("kind", KINDS)
def test_edge_inputs(check, kind):
    check(f"SELECT * FROM a {kind} e ON ak = bk")
    check(f"SELECT * FROM e {kind} a ON ak = bk")
    check(f"SELECT * FROM a {kind} far ON ak = far.bk")
    check(f"SELECT * FROM one {kind} same ON one.ak = same.bk")


def test_semi_anti(check):
    check("SELECT * FROM a SEMI JOIN b ON ak = bk")
    check("SELECT * FROM a ANTI JOIN b ON ak = bk")
    check("SELECT * FROM a WHERE ak IN (SELECT bk FROM b)")
    check("SELECT * FROM a WHERE ak NOT IN (SELECT bk FROM b WHERE bk IS NOT NULL)")
    check("SELECT * FROM a WHERE ak NOT IN (SELECT bk FROM b)")  # b has NULL keys: no rows
    check("SELECT * FROM a WHERE ak NOT IN (SELECT bk FROM e)")
    check("SELECT * FROM a WHERE EXISTS (SELECT * FROM b WHERE bk = ak AND bv > av)")
    check("SELECT * FROM a WHERE NOT EXISTS (SELECT * FROM b WHERE bk = ak AND bs <> a.as)")


def test_comma_joins_and_order(check):
    check("SELECT a.ak, b.bv, cname FROM a, b, c WHERE ak = bk AND bk = ck AND av > 50")
    # FROM order a, c, b with only a-b and b-c predicates: no cross product of a and c
    rel = check.con.sql("SELECT cname, av FROM a, c, b WHERE ak = bk AND bk = ck")
    assert "cross" not in rel.explain()
    check("SELECT cname, av FROM a, c, b WHERE ak = bk AND bk = ck")


def test_non_equi_and_cross(check):
    check("SELECT * FROM one, same WHERE one.av < same.bv")
    check("SELECT * FROM one CROSS JOIN same")
    check("SELECT count(*) FROM a JOIN b ON av < bv")


def test_join_then_aggregate(check):
    check("SELECT bs, count(*), sum(av), count(DISTINCT bk) FROM a JOIN b ON ak = bk GROUP BY bs")
    check("SELECT ak, count(bk) FROM a LEFT JOIN b ON ak = bk AND bv > 90 GROUP BY ak")


def test_join_pairs_direct():
    import torch
    from opforge.sql.physical.join import join_pairs
    l = torch.tensor([1, 2, 2, 5, 9])
    r = torch.tensor([2, 2, 1, 7, 2])
    li, ri = join_pairs(l, r)
    got = sorted(zip(li.tolist(), ri.tolist()))
    ref = sorted((i, j) for i in range(5) for j in range(5) if l[i] == r[j])
    assert got == ref


def test_outer_join_where_is_not_pushed_below_the_null_padding(check):
    check("SELECT * FROM a LEFT JOIN b ON ak = bk WHERE bv IS NULL")
    check("SELECT * FROM a LEFT JOIN b ON ak = bk WHERE bv > 50 AND av < 50")
    check("SELECT * FROM a RIGHT JOIN b ON ak = bk WHERE av IS NULL OR av > 90")
    check("SELECT * FROM a FULL JOIN b ON ak = bk AND av > 50 WHERE coalesce(av, bv) > 20")
    check("SELECT * FROM a LEFT JOIN b ON ak = bk AND av > 50")  # ON over the preserved side only


def test_self_join_with_aliases(check):
    check("SELECT x.ak, y.av FROM a x JOIN a y ON x.ak = y.ak AND x.av <> y.av WHERE x.as = 'x'")


def test_join_keys_of_different_types():
    import decimal
    left = pa.table({"x32": pa.array([1, 2, 3, None], pa.int32()),
                     "xd": pa.array([decimal.Decimal("1.50"), decimal.Decimal("2.00"), None, decimal.Decimal("3.00")], pa.decimal128(15, 2)),
                     "xf": pa.array([1.0, 2.5, -0.0, None]), "xs": pa.array(["a", "b", None, "d"])})
    right = pa.table({"y64": pa.array([1, 1, 3, 4], pa.int64()),
                      "yd": pa.array([decimal.Decimal("1.5"), decimal.Decimal("2.0"), decimal.Decimal("7.0"), None], pa.decimal128(10, 1)),
                      "yf": pa.array([0.0, 2.5, 1.0, 2.5]), "ys": pa.array(["d", "a", "a", None])})
    check = SqlCheck({"l": left, "r": right})
    for cond in ["x32 = y64", "xd = yd", "x32 = yd", "xf = yf", "xf = y64", "xs = ys", "x32 = y64 AND xs = ys"]:
        for kind in ["JOIN", "LEFT JOIN", "FULL JOIN"]:
            check(f"SELECT * FROM l {kind} r ON {cond}")
