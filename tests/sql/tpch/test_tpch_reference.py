"""DuckDB's answers: present for all 22 queries, typed as DuckDB types them, cached as
Parquet, and checked against pandas on Q1 and Q6."""

from decimal import Decimal

import pyarrow as pa
import pyarrow.parquet as pq

from opforge.sql.tpch import queries, reference

LIMITS = {2: 100, 3: 10, 10: 20, 18: 100, 21: 100}


def test_every_answer_is_non_empty_and_within_its_limit(tpch_answers):
    assert sorted(tpch_answers) == list(queries.NUMBERS)
    for n, table in tpch_answers.items():
        assert table.num_rows > 0, n
        assert table.num_rows <= LIMITS.get(n, 10**9), n
    # group counts the data's domains fix: returnflag x linestatus, 5 priorities, 2 ship modes, 7 country codes
    assert tpch_answers[1].num_rows == 4 and tpch_answers[4].num_rows == 5
    assert tpch_answers[12].num_rows == 2 and tpch_answers[22].num_rows == 7
    for n in (6, 14, 17, 19):
        assert tpch_answers[n].num_rows == 1


def test_answer_types_are_duckdbs(tpch_answers):
    q1 = tpch_answers[1].schema
    assert q1.field("avg_qty").type == pa.float64()  # avg -> DOUBLE
    assert pa.types.is_decimal(q1.field("sum_qty").type) and q1.field("sum_qty").type.scale == 2
    assert q1.field("sum_charge").type.scale == 6  # decimal products keep their scale
    assert q1.field("count_order").type == pa.int64()  # count -> BIGINT
    assert tpch_answers[14].schema.field("promo_revenue").type == pa.float64()


def test_answers_are_cached_as_parquet_and_reused(tpch_answers, tpch_root, monkeypatch):
    files = sorted((tpch_root / "sf0.01" / "answers").glob("q*.parquet"))
    assert len(files) == 22 and not list((tpch_root / "sf0.01" / "answers").glob("*.pkl"))
    assert pq.read_table(files[0]).equals(tpch_answers[1])

    def no_duckdb(*_args, **_kwargs):
        raise AssertionError("a cached answer must not run DuckDB")

    monkeypatch.setattr(reference, "run", no_duckdb)
    assert reference.answer(9, 0.01, tpch_root).equals(tpch_answers[9])


def test_q1_and_q6_match_pandas(tpch_paths, tpch_answers):
    li = pq.read_table(tpch_paths["lineitem"]).to_pandas()  # decimals as Python Decimal: exact
    li = li[li["l_shipdate"].astype(str) <= "1998-09-02"]  # 1998-12-01 - 90 days
    groups = li.groupby(["l_returnflag", "l_linestatus"])
    q1 = tpch_answers[1].to_pandas()
    assert list(zip(q1["l_returnflag"], q1["l_linestatus"])) == sorted(groups.groups)
    for (flag, status), g in groups:
        row = q1[(q1["l_returnflag"] == flag) & (q1["l_linestatus"] == status)].iloc[0]
        assert row["count_order"] == len(g)
        assert row["sum_qty"] == sum(g["l_quantity"], Decimal(0))
        assert row["sum_disc_price"] == sum((p * (1 - d) for p, d in zip(g["l_extendedprice"], g["l_discount"])), Decimal(0))

    li = pq.read_table(tpch_paths["lineitem"]).to_pandas()
    day = li["l_shipdate"].astype(str)
    sel = li[(day >= "1994-01-01") & (day < "1995-01-01") & li["l_discount"].between(Decimal("0.05"), Decimal("0.07"))
             & (li["l_quantity"] < 24)]
    expected = sum((p * d for p, d in zip(sel["l_extendedprice"], sel["l_discount"])), Decimal(0))
    assert tpch_answers[6].column("revenue")[0].as_py() == expected


def test_connect_materializes_tables_and_reports_load_time(tpch_paths):
    con, seconds = reference.connect(tpch_paths, threads=1)
    assert seconds > 0
    kinds = dict(con.sql("select table_name, table_type from information_schema.tables").fetchall())
    assert kinds == {name: "BASE TABLE" for name in tpch_paths}
    assert reference.run(con, "select count(*) as n from nation").column("n")[0].as_py() == 25
