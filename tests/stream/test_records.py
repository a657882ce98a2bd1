"""Micro-batches convert records and Arrow both ways, exactly."""

from collections import namedtuple
from dataclasses import dataclass

import pyarrow as pa
import pytest
import torch

from opforge.stream import Batch, RecordSchema

Point = namedtuple("Point", "x y")


@dataclass
class Bid:
    auction: int
    price: float
    bidder: str


@pytest.mark.parametrize("records", [
    [(1, 2.5, "a"), (2, -1.0, "b")],
    [{"k": 1, "v": True}, {"k": 2, "v": False}],
    [Bid(1, 2.0, "x"), Bid(3, 4.5, "y")],
    [Point(1, 2), Point(3, 4)],
    [7, 8, 9],
    ["s", "t"],
])
def test_records_round_trip(records):
    b = Batch.from_records(records, "cpu", timestamps=[5] * len(records))
    assert b.records() == records
    assert [type(r) for r in b.records()] == [type(r) for r in records]
    assert b.timestamps.tolist() == [5] * len(records)


def test_numeric_columns_are_tensors_and_strings_lists():
    b = Batch.from_records([(1, 2.0, "a", True)], "cpu")
    assert b["f0"].dtype == torch.int64 and b["f1"].dtype == torch.float64
    assert b["f2"] == ["a"] and b["f3"].dtype == torch.bool


def test_mixed_int_float_column_is_float():
    b = Batch.from_records([(1,), (2.5,)], "cpu")
    assert b["f0"].dtype == torch.float64 and b.records() == [(1.0,), (2.5,)]


def test_missing_field_names_the_stream():
    with pytest.raises(ValueError, match="no_such|does not match"):
        Batch.from_records([{"a": 1, "b": 2}, {"a": 3}], "cpu", where="my_source")


def test_wrong_tuple_length_is_an_error():
    with pytest.raises(ValueError, match="my_map.*does not match"):
        Batch.from_records([(1, 2), (3,)], "cpu", where="my_map")


def test_arrow_both_ways():
    table = pa.table({"id": pa.array([1, 2, 3], pa.int32()), "price": [1.5, 2.5, 3.5], "name": ["a", "b", "c"]})
    b = Batch.from_arrow(table, "cpu")
    assert b["id"].dtype == torch.int64 and b["name"] == ["a", "b", "c"]
    assert b.records() == [{"id": 1, "price": 1.5, "name": "a"}, {"id": 2, "price": 2.5, "name": "b"},
                           {"id": 3, "price": 3.5, "name": "c"}]
    back = b.to_arrow()
    assert back.column("price").to_pylist() == [1.5, 2.5, 3.5]
    assert back.column("name").to_pylist() == ["a", "b", "c"]


def test_select_and_concat_keep_rows_in_order():
    b = Batch.from_records([(i, str(i)) for i in range(6)], "cpu", timestamps=list(range(6)))
    s = b.select(torch.tensor([4, 1]))
    assert s.records() == [(4, "4"), (1, "1")] and s.timestamps.tolist() == [4, 1]
    c = Batch.concat([s, b.select(b["f0"] > 4)])
    assert c.records() == [(4, "4"), (1, "1"), (5, "5")]


def test_schema_of_value_records():
    assert RecordSchema.of(3).kind == "value" and RecordSchema.of((1, 2)).names == ("f0", "f1")
