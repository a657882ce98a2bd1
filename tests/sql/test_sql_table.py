"""Columnar tables: Arrow / pandas / Parquet / CSV round trips keep values, NULLs and types."""
import datetime
import decimal

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import torch

import opforge.sql as sql
from opforge.sql import types as T
from opforge.sql.column import Column
from opforge.sql.table import Table

from sql_reference import random_table


@pytest.fixture
def rng():
    return np.random.default_rng(7)


def test_arrow_round_trip_with_nulls(rng):
    t = random_table(rng, 200)
    back = Table.load(t, "cpu").to_arrow()
    assert back.schema == t.schema
    assert back.equals(t)


def test_storage_layout(rng):
    t = random_table(rng, 50)
    tab = Table.load(t, "cpu")
    s = tab.column("s")
    assert s.type == T.STRING and s.values.dtype == torch.int32
    assert list(s.dictionary) == sorted(set(x for x in t.column("s").to_pylist() if x is not None))
    d = tab.column("d")
    assert d.type == T.decimal(15, 2) and d.values.dtype == torch.int64
    ref = [None if x is None else int(x * 100) for x in t.column("d").to_pylist()]
    got = [None if not ok else v for v, ok in zip(d.values.tolist(), d.valid.tolist())]
    assert got == ref
    assert tab.column("dt").values.dtype == torch.int32
    assert tab.column("k").valid is not None and tab.column("k").valid.dtype == torch.bool


def test_no_nulls_means_no_validity():
    tab = Table.load(pa.table({"x": [1, 2, 3]}), "cpu")
    assert tab.column("x").valid is None


def test_dictionary_and_view_strings():
    plain = pa.array(["b", "a", None, "b"])
    for arr in (plain, plain.dictionary_encode(), plain.cast(pa.string_view()), plain.cast(pa.large_string())):
        col = Column.from_arrow(arr, "cpu")
        assert col.dictionary == ("a", "b")
        assert col.to_arrow().to_pylist() == ["b", "a", None, "b"]


def test_pandas_round_trip():
    df = pd.DataFrame({"x": [1, 2, None], "y": ["u", None, "w"], "z": [0.5, np.nan, 2.0]})
    con = sql.connect("cpu").register("t", df)
    out = con.sql("SELECT * FROM t").to_pandas()
    pd.testing.assert_frame_equal(out, pd.DataFrame({"x": [1.0, 2.0, np.nan], "y": ["u", None, "w"], "z": [0.5, np.nan, 2.0]}))


def test_parquet_and_csv_paths(tmp_path, rng):
    t = random_table(rng, 64)
    pq.write_table(t, tmp_path / "t.parquet")
    con = sql.connect("cpu")
    con.register("p", tmp_path / "t.parquet")
    assert con.sql("SELECT * FROM p").to_arrow().equals(t)
    small = pa.table({"a": [1, None, 3], "s": ["x", "y", None], "dt": pa.array([datetime.date(2020, 1, 2), None, datetime.date(1999, 12, 31)])})
    pacsv.write_csv(small, tmp_path / "t.csv")
    con.register("c", str(tmp_path / "t.csv"))
    out = con.sql("SELECT * FROM c").to_arrow()
    assert out.column("a").to_pylist() == [1, None, 3]
    assert out.column("s").to_pylist() == ["x", "y", None]
    assert out.column("dt").to_pylist() == [datetime.date(2020, 1, 2), None, datetime.date(1999, 12, 31)]
    assert sorted(con.tables()) == ["c", "p"]


def test_register_errors(tmp_path):
    con = sql.connect("cpu")
    with pytest.raises(sql.SqlError, match="does not exist"):
        con.register("t", str(tmp_path / "missing.parquet"))
    with pytest.raises(TypeError, match="register"):
        con.register("t", 42)
    with pytest.raises(ValueError, match="identifier"):
        con.register("not a name", pa.table({"x": [1]}))


def test_decimal_extremes_exact():
    vals = [decimal.Decimal("9999999999999.99"), decimal.Decimal("-9999999999999.99"), decimal.Decimal("0.01"), None]
    t = pa.table({"d": pa.array(vals, pa.decimal128(15, 2))})
    assert Table.load(t, "cpu").to_arrow().equals(t)


def test_wide_decimal_loads_exactly():
    """DECIMAL(30,1) is held in 128 bits (sql/decimal128.py): values past int64 come back exactly."""
    values = [decimal.Decimal("1.5"), decimal.Decimal("-12345678901234567890123456789.9"), None]
    t = pa.table({"d": pa.array(values, pa.decimal128(30, 1))})
    col = Table.load(t, "cpu").column("d")
    assert col.type.wide and col.to_arrow().type == pa.decimal128(30, 1) and col.to_arrow().to_pylist() == values


def test_dictionary_order_is_python_string_order():
    words = ["b", "B", "é", "a", "z", "ä", "", "ab", "\u4e2d", "Z"]
    col = Column.from_arrow(pa.array(words), "cpu")
    assert list(col.dictionary) == sorted(set(words))
    assert col.to_arrow().to_pylist() == words
