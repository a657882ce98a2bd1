"""String columns on the out-of-core path: each coded once over the whole file into one sorted
dictionary (``chunked_scan.HostCache.strings``), and dictionaries past what 32-bit offsets address
kept as ``large_string`` (TPC-H o_comment at SF100: 7 GB of distinct words). The 2 GiB line is
lowered here so that a small file crosses it. Answers are checked against DuckDB."""
import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from opforge import sql
from opforge.sql import column_load, string_sort
from opforge.sql.column import ArrowWords
from opforge.sql.expr import string_functions
from opforge.sql.outofcore import chunked_scan

QUERIES = [
    "select count(*) from t where c not like '%special%requests%'",
    "select count(*) from t where c like 'b%'",
    "select c, k from t order by c, k limit 7",
    "select k % 9 as g, min(c), max(c), count(distinct c) from t group by g order by g",
    "select count(*), count(t.c) from t join u on t.c = u.c",
    "select s, count(*) from t group by s order by s",
    "select substring(c, 1, 3) as p, count(*) from t group by p order by p limit 5",
]


def _files(tmp_path):
    rng = np.random.default_rng(3)
    n = 12000
    vocab = ["special", "requests", "blithely", "final", "deposits", "ironic", "pending", "é", "quickly"]
    comments = [" ".join(rng.choice(vocab, rng.integers(1, 6))) + f" {int(x)}" for x in rng.integers(0, 4000, n)]
    comments = [None if i % 97 == 0 else c for i, c in enumerate(comments)]
    t = pa.table({"k": np.arange(n), "c": comments, "s": [f"s{int(x)}" for x in rng.integers(0, 5, n)]})
    u = pa.table({"c": [c for c in comments[::7] if c is not None][:900]})
    paths = {}
    for name, table in (("t", t), ("u", u)):
        paths[name] = str(tmp_path / f"{name}.parquet")
        pq.write_table(table, paths[name], row_group_size=1500)
    return paths


@pytest.mark.parametrize("wide", [False, True], ids=["string", "large_string"])
def test_string_columns_coded_once_match_duckdb(tmp_path, monkeypatch, wide):
    paths = _files(tmp_path)
    if wide:
        monkeypatch.setattr(column_load, "STRING_BYTES_MAX", 4096)
    monkeypatch.setattr(string_functions, "device_like", lambda col: True)  # the GPU's LIKE, on CPU tensors
    monkeypatch.setattr(chunked_scan, "_DICTIONARIES", {})
    monkeypatch.setattr(chunked_scan, "HOST_CACHE", chunked_scan.HostCache())
    index_in = []
    real_codes = chunked_scan._codes
    monkeypatch.setattr(chunked_scan, "_codes", lambda arr, ordered: index_in.append(1) or real_codes(arr, ordered))
    con = sql.connect("cpu", memory_limit="64KiB")
    ref = duckdb.connect()
    for name, path in paths.items():
        con.register(name, path)
        ref.sql(f"create view {name} as select * from read_parquet('{path}')")
    for q in QUERIES:
        assert con.sql(q).fetchall() == ref.sql(q).fetchall(), q
    assert not index_in  # every column was coded in one pass, no row group mapped word by word
    words = next(w for k, (w, _) in chunked_scan._DICTIONARIES.items() if k[0][0] == paths["t"] and k[-1] == "c")
    assert isinstance(words, ArrowWords) == (len(words) >= column_load.LAZY_WORDS) or wide
    if wide:
        assert isinstance(words, ArrowWords) and words.arrow.type == pa.large_string()


def test_narrowed_keeps_wide_words_only_past_the_offsets(monkeypatch):
    words = pa.array(["a", "bb", "ccc"], pa.large_string())
    assert column_load.narrowed(words).type == pa.string()
    assert column_load.narrowed(words.slice(1)).to_pylist() == ["bb", "ccc"]
    monkeypatch.setattr(column_load, "STRING_BYTES_MAX", 4)
    assert column_load.narrowed(words).type == pa.large_string()
    assert column_load.narrowed(words.slice(2)).type == pa.string()  # 3 bytes of the slice
    with pytest.raises(TypeError, match="string array"):
        ArrowWords(pa.array([1, 2]))


def test_words_ranked_on_the_device_only_when_the_sort_fits_the_limit(tmp_path):
    path = _files(tmp_path)["t"]
    meta = pq.ParquetFile(path).metadata
    files = [(path, meta)]
    col = meta.schema.to_arrow_schema().get_field_index("c")
    words = sum(meta.row_group(g).column(col).total_uncompressed_size for g in range(meta.num_row_groups))
    need = (words + chunked_scan.DEVICE_SORT_ROW_BYTES * meta.num_rows + string_sort.GATHER_WORK_BYTES) \
        / chunked_scan.DEVICE_SORT_SHARE
    assert chunked_scan._sort_device(files, "c", "cuda", None) == "cuda"  # no limit
    assert chunked_scan._sort_device(files, "c", "cuda", int(need) + 1) == "cuda"
    assert chunked_scan._sort_device(files, "c", "cuda", int(need) - 1).type == "cpu"
    assert chunked_scan._sort_device(files, "c", "cpu", 1) == "cpu"


def test_decimals_cached_as_decimal64_keep_their_values():
    import decimal

    values = [decimal.Decimal("-1.25"), None, decimal.Decimal("9999999999999.99"), decimal.Decimal("-9999999999999.99"),
              decimal.Decimal("0.01")]
    arr = pa.array(values * 3, pa.decimal128(15, 2)).slice(2)
    wide = pa.chunked_array([arr, arr.slice(1, 2)])  # values past int32: no narrower integer holds them
    got = chunked_scan.narrowest(wide)
    assert got.type == pa.decimal64(15, 2) and got.to_pylist() == wide.to_pylist() and got.null_count == wide.null_count
    assert chunked_scan.narrowest(pa.chunked_array([pa.array(values, pa.decimal128(19, 2))])).type == pa.decimal128(19, 2)
    small = pa.chunked_array([pa.array(values[:2] + values[4:], pa.decimal128(15, 2))])
    assert chunked_scan.narrowest(small).type == pa.int8() and chunked_scan.narrowest(small).to_pylist() == [-125, None, 1]
