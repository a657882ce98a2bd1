"""``cluster/exchange.py`` between 2 real Gloo ranks (no Ray): a gather gives every rank every
rank's rows in rank order, a shuffle gives each rank the rows sent to it (rank 0's first, each in its
order), with NULLs, bools, 2-wide decimals, and string and LIST columns whose dictionaries differ
per rank re-coded to one sorted dictionary, the same on both ranks. Either exchange takes at most
two collectives (a header, then one payload), whatever the columns (issue #29)."""
import importlib.util
from pathlib import Path

import pytest
import torch.distributed as dist

import exchange_ranks as job

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="no Gloo")

_SPEC = importlib.util.spec_from_file_location("spawn_ranks",
                                               Path(__file__).resolve().parents[1] / "sql" / "spawn_ranks.py")
spawn_ranks = importlib.util.module_from_spec(_SPEC)
_SPEC.loader.exec_module(spawn_ranks)

WORLD = 2


def _concat(parts: list[dict]) -> dict:
    return {name: [v for p in parts for v in p[name]] for name in job.ARROW_TYPES}


def _sent_to(dst: int) -> dict:
    parts = []
    for src in range(WORLD):
        r, d = job.rows(src), job.dests(src)
        parts.append({name: [v for v, to in zip(r[name], d) if to == dst] for name in job.ARROW_TYPES})
    return _concat(parts)


def _as_python(values: dict) -> dict:
    return {name: [int(v) if name == "d" and v is not None else v for v in vs] for name, vs in values.items()}


@pytest.fixture(scope="module")
def results():
    got = spawn_ranks.run_ranks(job.run, (), world=WORLD, timeout=90)
    errors = [r[2] for r in got if r[1] == "error"]
    assert not errors, "\n".join(errors)
    return got


def test_gather_gives_every_rank_all_rows_in_rank_order(results):
    want = _concat([job.rows(r) for r in range(WORLD)])
    for rank, out, _ in results:
        assert _as_python(out["gather"][0]) == want, f"rank {rank}"


def test_shuffle_gives_each_rank_the_rows_sent_to_it(results):
    for rank, out, _ in results:
        assert _as_python(out["shuffle"][0]) == _sent_to(rank), f"rank {rank}"


def test_coded_columns_end_with_one_sorted_dictionary_on_every_rank(results):
    for kind in ("gather", "shuffle"):
        dicts = [out[kind][1] for _, out, _ in results]
        for name in ("s", "l", "same"):
            d = dicts[0][name]
            assert list(d) == sorted(d), (kind, name)
            assert all(other[name] == d for other in dicts[1:]), (kind, name)  # code order = value order everywhere


def test_a_rank_without_rows_and_a_batch_without_columns(results):
    want = _concat([job.rows(0)])  # rank 1 sends nothing
    for rank, out, _ in results:
        assert _as_python(out["gather_one_empty"]) == want
        assert _as_python(out["shuffle_one_empty"]) == (want if rank == 0 else _concat([]))
        assert out["shuffle_to_itself"] == (job.rows(0)["i"] if rank == 0 else [])
        gathered, shuffled = out["no_columns"]
        assert gathered == sum(len(job.rows(r)["i"]) for r in range(WORLD))
        assert shuffled == sum(job.dests(r).count(rank) for r in range(WORLD))


def test_an_exchange_is_two_collectives(results):
    for rank, _, counts in results:
        assert counts["gather"] <= 2 and counts["shuffle"] <= 2, (rank, counts)


@pytest.mark.parametrize("arrow_type, values", [
    ("s", [["pear", "apple", None], ["apple", "kiwi", "pear"]]),
    ("l", [[[1, 2], [3], None, [0.0]], [[3], [-0.0], [1, 2], []]]),
    ("st", [[{"a": 1, "b": "x"}, {"a": 2, "b": None}], [{"a": 2, "b": None}, {"a": 1, "b": "x"}]]),
])
def test_equal_values_hash_alike_whatever_their_codes(arrow_type, values):
    """Each worker codes its own strings and LIST / STRUCT values: a row's worker must follow the
    value, not its code (found: LIST keys were hashed by code, so one value's rows could meet on two
    workers)."""
    import pyarrow as pa

    from opforge.cluster import exchange as X
    from opforge.sql.column import Column

    typ = {"s": pa.string(), "l": pa.list_(pa.float64()),
           "st": pa.struct([("a", pa.int64()), ("b", pa.string())])}[arrow_type]
    bits = {}
    for vs in values:  # two columns, two dictionaries
        col = Column.from_arrow(pa.array(vs, typ), "cpu")
        for v, b in zip(vs, X.key_bits(col).tolist()):
            bits.setdefault(repr(v).replace("-0.0", "0.0"), set()).add(b)
    assert all(len(b) == 1 for b in bits.values()), bits
    assert len(set().union(*bits.values())) == len(bits)  # distinct values, distinct bits here


@pytest.mark.parametrize("lazy", [False, True])
def test_compacted_dictionaries_keep_only_the_words_the_rows_use(lazy, monkeypatch):
    import pyarrow as pa
    import torch

    from opforge.cluster import exchange as X
    from opforge.sql.column import ArrowWords, Column

    monkeypatch.setattr(X, "COMPACT_WORDS", 8)
    words = tuple(f"w{i:03d}" for i in range(40))
    codes = torch.tensor([7, 3, 3, 39, 0, 12], dtype=torch.int32)
    valid = torch.tensor([True, True, False, True, True, True])
    col = Column(codes, valid, Column.from_arrow(pa.array(["x"]), "cpu").type,
                 ArrowWords(pa.array(words)) if lazy else words)
    small = X.compacted(col)
    assert tuple(small.dictionary) == ("w000", "w003", "w007", "w012", "w039")
    assert small.to_arrow().to_pylist() == col.to_arrow().to_pylist() == ["w007", "w003", None, "w039", "w000", "w012"]
    assert X.compacted(Column(codes[:1].repeat(30), None, col.type, words[:30])).dictionary == ("w007",)
    most = Column(torch.arange(30, dtype=torch.int32), None, col.type, words)
    assert X.compacted(most) is most  # uses most of its words: sent as it is
