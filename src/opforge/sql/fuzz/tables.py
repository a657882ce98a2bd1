"""The fuzzer's tables: a key-range slice of TPC-H at SF 0.01 with NULLs put into it.

TPC-H has no NULLs and its SF 0.01 tables (60k lineitems) make each query cost tens of
milliseconds; the slice keeps every table small (hundreds of rows, so a few hundred queries run
in seconds) and keeps foreign keys that point outside the slice (outer joins then find rows with
no partner). A seeded share of every non-key column, foreign keys included, is set to NULL, so
outer joins, NOT IN, coalesce and IS DISTINCT FROM meet NULLs on both sides.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

# table -> (primary key columns, {column: kind}); kinds: int, dec, str, date
COLUMNS: dict[str, tuple[tuple[str, ...], dict[str, str]]] = {
    "region": (("r_regionkey",), {"r_regionkey": "int", "r_name": "str"}),
    "nation": (("n_nationkey",), {"n_nationkey": "int", "n_name": "str", "n_regionkey": "int"}),
    "supplier": (("s_suppkey",), {"s_suppkey": "int", "s_name": "str", "s_nationkey": "int", "s_acctbal": "dec"}),
    "customer": (("c_custkey",), {"c_custkey": "int", "c_name": "str", "c_nationkey": "int", "c_acctbal": "dec",
                                  "c_mktsegment": "str"}),
    "part": (("p_partkey",), {"p_partkey": "int", "p_brand": "str", "p_size": "int", "p_retailprice": "dec"}),
    "partsupp": (("ps_partkey", "ps_suppkey"), {"ps_partkey": "int", "ps_suppkey": "int", "ps_availqty": "int",
                                                "ps_supplycost": "dec"}),
    "orders": (("o_orderkey",), {"o_orderkey": "int", "o_custkey": "int", "o_orderstatus": "str",
                                 "o_totalprice": "dec", "o_orderdate": "date", "o_orderpriority": "str"}),
    "lineitem": (("l_orderkey", "l_linenumber"), {"l_orderkey": "int", "l_linenumber": "int", "l_partkey": "int",
                                                  "l_suppkey": "int", "l_quantity": "dec", "l_discount": "dec",
                                                  "l_returnflag": "str", "l_shipdate": "date"}),
}

# the key range kept per table: rows whose first key column is <= the bound
SLICE = {"region": 5, "nation": 25, "supplier": 40, "customer": 150, "part": 120, "partsupp": 100,
         "orders": 600, "lineitem": 400}

# equi-join edges (a.col = b.col): TPC-H's foreign keys and one shared attribute
EDGES: tuple[tuple[str, str, str, str], ...] = (
    ("nation", "n_regionkey", "region", "r_regionkey"),
    ("supplier", "s_nationkey", "nation", "n_nationkey"),
    ("customer", "c_nationkey", "nation", "n_nationkey"),
    ("customer", "c_nationkey", "supplier", "s_nationkey"),
    ("orders", "o_custkey", "customer", "c_custkey"),
    ("lineitem", "l_orderkey", "orders", "o_orderkey"),
    ("lineitem", "l_partkey", "part", "p_partkey"),
    ("lineitem", "l_suppkey", "supplier", "s_suppkey"),
    ("partsupp", "ps_partkey", "part", "p_partkey"),
    ("partsupp", "ps_suppkey", "supplier", "s_suppkey"),
)

NULL_SHARE = 0.2


@dataclass
class FuzzTables:
    """The sliced, NULL-bearing tables and, per column, the values a literal is drawn from."""

    tables: dict[str, pa.Table]
    values: dict[tuple[str, str], list]  # (table, column) -> distinct non-NULL values, sorted

    def kind(self, table: str, column: str) -> str:
        return COLUMNS[table][1][column]


def build(paths: dict, seed: int = 0) -> FuzzTables:
    """The fuzz tables from TPC-H Parquet files ``paths`` ({table: path}, e.g. ``tpch.data.generate(0.01)``)."""
    rng = random.Random(seed)
    tables, values = {}, {}
    for name, (keys, cols) in COLUMNS.items():
        t = pq.read_table(paths[name], columns=list(cols))
        t = t.filter(pc.less_equal(t[keys[0]], SLICE[name]))
        t = pa.table({c: _with_nulls(t[c], rng) if c not in keys else t[c] for c in cols})
        tables[name] = t
        for c in cols:
            distinct = pc.unique(t[c].drop_null()).to_pylist()
            values[(name, c)] = sorted(distinct)
    return FuzzTables(tables, values)


def _with_nulls(column: pa.ChunkedArray, rng: random.Random) -> pa.Array:
    mask = pa.array([rng.random() < NULL_SHARE for _ in range(len(column))])
    return pc.if_else(mask, pa.scalar(None, column.type), column.combine_chunks())
