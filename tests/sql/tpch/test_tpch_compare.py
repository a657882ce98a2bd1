"""compare(): every kind of difference TPC-H validation must catch, and the equalities it must accept."""

import datetime as dt
from decimal import Decimal

import pyarrow as pa
import pytest

from opforge.sql.tpch.compare import compare, order_is_determined, type_class


def ref_table():
    return pa.table(
        {
            "k": pa.array(["A", "B", "C", "D"]),
            "n": pa.array([1, 2, 3, None], pa.int64()),
            "amount": pa.array([Decimal("1.50"), Decimal("2.25"), Decimal("-3.00"), Decimal("0.01")], pa.decimal128(38, 2)),
            "avg": pa.array([0.1, 2.5e10, -3.0, None], pa.float64()),
            "day": pa.array([dt.date(1995, 3, 15), dt.date(1998, 12, 1), dt.date(1992, 1, 2), dt.date(1994, 1, 1)]),
        }
    )


def replace(table, name, values, typ=None):
    i = table.column_names.index(name)
    return table.set_column(i, name, pa.array(values, typ or table.schema.field(name).type))


def test_equal_tables_have_no_differences():
    assert compare(ref_table(), ref_table(), ordered=True) == []
    assert compare(ref_table(), ref_table(), ordered=False) == []


@pytest.mark.parametrize(
    "column, values",
    [
        ("k", ["A", "B", "X", "D"]),
        ("n", [1, 2, 4, None]),
        ("amount", [Decimal("1.50"), Decimal("2.26"), Decimal("-3.00"), Decimal("0.01")]),
        ("day", [dt.date(1995, 3, 15), dt.date(1998, 12, 2), dt.date(1992, 1, 2), dt.date(1994, 1, 1)]),
        ("n", [1, 2, 3, 0]),  # NULL is not 0
    ],
)
def test_a_changed_value_is_reported(column, values):
    ours = replace(ref_table(), column, values)
    for ordered in (True, False):
        diffs = compare(ours, ref_table(), ordered=ordered, order_by=["k"] if ordered else None)
        assert diffs and any(column in d for d in diffs), diffs


def test_float_tolerance_is_1e9_relative():
    near = replace(ref_table(), "avg", [0.1 * (1 + 1e-12), 2.5e10 + 1e-3, -3.0, None])
    assert compare(near, ref_table(), ordered=True) == []
    far = replace(ref_table(), "avg", [0.1, 2.5e10 * (1 + 1e-8), -3.0, None])
    diffs = compare(far, ref_table(), ordered=True)
    assert len(diffs) == 1 and "avg" in diffs[0] and "row 1" in diffs[0]


def test_nulls_equal_nulls_and_nans_equal_nans():
    t = pa.table({"x": pa.array([None, float("nan"), 1.0])})
    assert compare(t, t, ordered=True) == []
    assert compare(pa.table({"x": pa.array([None, 0.0, 1.0])}), t, ordered=True) != []


def test_a_missing_row_is_reported():
    ours = ref_table().slice(0, 3)
    for ordered in (True, False):
        diffs = compare(ours, ref_table(), ordered=ordered)
        assert any("row count: ours 3, reference 4" in d for d in diffs)
        assert any(d.startswith("missing row ('D'") for d in diffs), diffs


def test_an_extra_row_is_reported():
    ours = pa.concat_tables([ref_table(), ref_table().slice(1, 1)])
    diffs = compare(ours, ref_table(), ordered=False)
    assert any(d.startswith("extra row ('B'") for d in diffs), diffs


def test_wrong_order_is_reported_only_when_ordered():
    permuted = ref_table().take([1, 0, 3, 2])
    assert any(d.startswith("order") for d in compare(permuted, ref_table(), ordered=True, order_by=["k"]))
    assert compare(permuted, ref_table(), ordered=True) != []  # no keys: row by row
    assert compare(permuted, ref_table(), ordered=False) == []


def test_rows_tied_on_the_order_by_keys_may_come_in_any_order():
    ref = pa.table({"g": [1, 1, 1, 2, 2], "v": ["a", "b", "c", "d", "e"]})
    within_ties = ref.take([2, 0, 1, 4, 3])
    assert compare(within_ties, ref, ordered=True, order_by=["g"]) == []
    across_ties = ref.take([3, 0, 1, 2, 4])
    assert any(d.startswith("order") for d in compare(across_ties, ref, ordered=True, order_by=["G"]))
    changed = pa.table({"g": [1, 1, 1, 2, 2], "v": ["a", "b", "x", "d", "e"]}).take([2, 0, 1, 4, 3])
    assert compare(changed, ref, ordered=True, order_by=["g"]) != []


@pytest.mark.parametrize(
    "ours_type, ref_type",
    [
        (pa.float64(), pa.decimal128(38, 2)),  # a decimal sum computed in floating point
        (pa.decimal128(38, 4), pa.decimal128(38, 2)),  # wrong scale
        (pa.float32(), pa.float64()),  # avg must be DOUBLE
        (pa.int64(), pa.float64()),
        (pa.string(), pa.int64()),
        (pa.timestamp("us"), pa.date32()),
    ],
)
def test_a_type_mismatch_is_reported(ours_type, ref_type):
    values = {pa.types.is_string(ours_type): ["1"], pa.types.is_timestamp(ours_type): [dt.datetime(1995, 1, 1)]}.get(True, [1])
    ref_values = [dt.date(1995, 1, 1)] if pa.types.is_date(ref_type) else [1]
    ours = pa.table({"c": pa.array(values).cast(ours_type)})
    ref = pa.table({"c": pa.array(ref_values, ref_type)})
    diffs = compare(ours, ref, ordered=False)
    assert len(diffs) == 1 and "type" in diffs[0], diffs


@pytest.mark.parametrize(
    "ours_type, ref_type",
    [
        (pa.int64(), pa.decimal128(38, 0)),  # DuckDB sums integers to HUGEINT
        (pa.int32(), pa.int64()),
        (pa.decimal128(18, 2), pa.decimal128(38, 2)),
        (pa.large_string(), pa.string()),
        (pa.string_view(), pa.string()),
    ],
)
def test_compatible_types_are_accepted(ours_type, ref_type):
    if pa.types.is_string(ref_type):
        raw = ["7", "8"]
    elif pa.types.is_decimal(ours_type) and pa.types.is_decimal(ref_type):
        raw = [Decimal("7.00"), Decimal("8.25")]
    else:
        raw = [7, 8]
    ours = pa.table({"c": pa.array(raw).cast(ours_type)})
    ref = pa.table({"c": pa.array(raw).cast(ref_type)})
    assert compare(ours, ref, ordered=True) == []


def test_dictionary_strings_compare_by_value():
    ref = pa.table({"c": ["x", "y"]})
    ours = pa.table({"c": pa.array(["x", "y"]).dictionary_encode()})
    assert compare(ours, ref, ordered=True) == []


def test_column_names_are_case_insensitive_but_must_match():
    ref = pa.table({"sum_qty": [1], "sum(l_quantity)": [2]})
    assert compare(pa.table({"SUM_QTY": [1], "SUM(l_quantity)": [2]}), ref, ordered=True) == []
    diffs = compare(pa.table({"qty": [1], "sum(l_quantity)": [2]}), ref, ordered=True)
    assert len(diffs) == 1 and "name" in diffs[0]
    assert "column count" in compare(pa.table({"sum_qty": [1]}), ref, ordered=True)[0]


def test_many_differences_are_summarized():
    ref = pa.table({"x": list(range(100))})
    diffs = compare(pa.table({"x": [v + 1 for v in range(100)]}), ref, ordered=True)
    assert len(diffs) == 11 and "90 more" in diffs[-1]


def test_order_is_determined_only_by_unique_order_keys():
    ref = pa.table({"a": [1, 2, 3], "b": [1, 1, 2]})
    assert order_is_determined("select a, b from t order by a", ref)
    assert not order_is_determined("select a, b from t order by b", ref)
    assert order_is_determined("select a, b from t order by b, a", ref)
    assert not order_is_determined("select a, b from t", ref)


def test_type_classes():
    assert type_class(pa.decimal128(38, 0)) == type_class(pa.int8()) == "int"
    assert type_class(pa.decimal128(15, 2)) == "decimal(scale=2)"
    assert type_class(pa.dictionary(pa.int32(), pa.string())) == "string"


def test_inputs_must_be_arrow_tables():
    with pytest.raises(TypeError, match="compare: ours and ref must be pyarrow.Table"):
        compare(ref_table().to_pandas(), ref_table(), ordered=True)
