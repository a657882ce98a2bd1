"""Reference harness for the SQL engine tests: run one query on opforge.sql and on DuckDB, compare the answers."""
import datetime
import decimal
import math

import duckdb
import numpy as np
import pyarrow as pa

import opforge.sql as sql


def _norm(v):
    if isinstance(v, decimal.Decimal):
        return ("dec", v)
    return v


def _same(a, b) -> bool:
    if isinstance(b, datetime.datetime) and b.time() == datetime.time(0) and type(a) is datetime.date:
        b = b.date()  # DuckDB: date +/- interval is a TIMESTAMP; opforge keeps DATE
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, float) or isinstance(b, float):
        a, b = float(a), float(b)
        if math.isnan(a) or math.isnan(b):
            return math.isnan(a) and math.isnan(b)
        return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)
    return a == b


def _key(row):
    return tuple((x is None, str(x)) for x in row)


class SqlCheck:
    """Registers the same Arrow tables in both engines and asserts equal results (and types)."""

    def __init__(self, tables: dict[str, pa.Table]):
        self.con = sql.connect("cpu")
        self.duck = duckdb.connect()
        for name, t in tables.items():
            self.con.register(name, t)
            self.duck.register(name, t)

    def reference(self, query: str) -> pa.Table:
        r = self.duck.sql(query).arrow()
        return r.read_all() if hasattr(r, "read_all") else r

    def __call__(self, query: str, ordered: bool = False, types: bool = True) -> pa.Table:
        mine = self.con.sql(query).to_arrow()
        ref = self.reference(query)
        assert mine.num_columns == ref.num_columns, (mine.schema, ref.schema)
        if types:
            for m, r in zip(mine.schema, ref.schema):
                rt = r.type
                if pa.types.is_timestamp(rt):
                    continue
                if pa.types.is_string_view(rt) or pa.types.is_large_string(rt):
                    rt = pa.string()
                assert m.type == rt, (query, m, r)
        a = [tuple(c[i] for c in [col.to_pylist() for col in mine.columns]) for i in range(mine.num_rows)]
        b = [tuple(c[i] for c in [col.to_pylist() for col in ref.columns]) for i in range(ref.num_rows)]
        assert len(a) == len(b), (query, len(a), len(b), a[:5], b[:5])
        if not ordered:
            a, b = sorted(a, key=_key), sorted(b, key=_key)
        for x, y in zip(a, b):
            assert all(_same(p, q) for p, q in zip(x, y)), (query, x, y)
        return mine


def random_table(rng: np.random.Generator, n: int, null_frac: float = 0.2, keys: int = 5) -> pa.Table:
    """Small table with NULLs in every column: ints, bigints, doubles, decimals, dates, strings, bools."""
    def nulls():
        return rng.random(n) < null_frac
    words = ["apple", "banana", "cherry", "date", "elder", "fig", "grape", "APPLE", "b%x", "a_c", ""]
    k = rng.integers(0, keys, n)
    return pa.table({
        "id": pa.array(np.arange(n), pa.int64()),
        "k": pa.array(k.astype(np.int32), mask=nulls()),
        "i": pa.array(rng.integers(-50, 50, n).astype(np.int32), mask=nulls()),
        "b": pa.array(rng.integers(-10**9, 10**9, n).astype(np.int64), mask=nulls()),
        "f": pa.array(np.round(rng.normal(0, 10, n), 3), mask=nulls()),
        "d": pa.array([decimal.Decimal(int(x)).scaleb(-2) for x in rng.integers(-10**6, 10**6, n)],
                      pa.decimal128(15, 2), mask=nulls()),
        "dt": pa.array(rng.integers(8000, 11000, n).astype(np.int32), mask=nulls()).cast(pa.date32()),
        "s": pa.array([words[j] for j in rng.integers(0, len(words), n)], pa.string(), mask=nulls()),
        "flag": pa.array(rng.random(n) < 0.5, mask=nulls()),
    })
