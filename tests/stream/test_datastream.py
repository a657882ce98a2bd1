"""DataStream transformations, the two function paths, partitioners, sinks."""

from dataclasses import dataclass

import pytest
import torch

from opforge.stream import (CollectionSource, CollectSink, FlatMapFunction, MapFunction, NumberSequenceSource, OutputTag,
                            ProcessFunction, StreamExecutionEnvironment, vectorized)
from stream_helpers import multiset

DATA = [(i % 5, i, float(i) / 4) for i in range(57)]


def run(build, data=DATA, parallelism=1, batch_size=8):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=batch_size)
    sink = build(env.from_collection(data)).collect()
    result = env.execute("test")
    return sink.records(), result


def test_map_filter_flat_map_match_python():
    def build(ds):
        return (ds.map(lambda r: (r[0], r[1] * 3, r[2]))
                  .filter(lambda r: r[1] % 2 == 0)
                  .flat_map(lambda r: [r] * (r[0] % 3)))

    got, _ = run(build)
    want = [(k, v * 3, x) for k, v, x in DATA if (v * 3) % 2 == 0 for _ in range(k % 3)]
    assert got == want


@vectorized
def triple_vec(batch):
    return {"f0": batch["f0"], "f1": batch["f1"] * 3, "f2": batch["f2"]}


@vectorized
def even_vec(batch):
    return batch["f1"] % 2 == 0


@vectorized
def repeat_vec(batch):
    reps = batch["f0"] % 3
    rows = torch.repeat_interleave(torch.arange(len(batch)), reps)
    return {"f0": batch["f0"][rows], "f1": batch["f1"][rows], "f2": batch["f2"][rows], "__row__": rows}


class Triple(MapFunction):
    def map(self, r):
        return (r[0], r[1] * 3, r[2])


class Repeat(FlatMapFunction):
    def flat_map(self, r):
        return [r] * (r[0] % 3)


@pytest.mark.parametrize("parallelism", [1, 3])
def test_vectorized_and_record_paths_agree(parallelism):
    env = StreamExecutionEnvironment(parallelism=parallelism, batch_size=7)
    src = env.from_collection([(r[0], r[1], r[2]) for r in DATA])
    slow = src.map(Triple()).filter(lambda r: r[1] % 2 == 0).flat_map(Repeat()).collect()
    fast = src.map(triple_vec).filter(even_vec).flat_map(repeat_vec).collect()
    env.execute()
    assert multiset(fast.records()) == multiset(slow.records())
    assert len(slow.records()) > 10
    if parallelism == 1:
        assert fast.records() == slow.records() and fast.timestamps() == slow.timestamps()


@dataclass
class Out:
    key: int
    double: int


def test_vectorized_map_to_dataclass_and_dicts():
    @vectorized(output=Out)
    def to_out(b):
        return {"key": b["f0"], "double": b["f1"] * 2}

    got, _ = run(lambda ds: ds.map(to_out))
    assert got == [Out(k, 2 * v) for k, v, _ in DATA]
    got, _ = run(lambda ds: ds.map(vectorized(lambda b: {"k": b["f0"]})))
    assert got == [{"k": k} for k, _, _ in DATA]


def test_vectorized_wrong_length_is_a_clear_error():
    with pytest.raises(ValueError, match="Map.*rows, expected"):
        run(lambda ds: ds.map(vectorized(lambda b: {"f0": b["f0"][:1]})))


def test_execute_reports_counts_and_timings():
    got, result = run(lambda ds: ds.filter(lambda r: r[0] == 0), parallelism=2)
    assert result.metrics["Filter"].records_in == len(DATA)
    assert result.metrics["Filter"].records_out == len(got) == sum(1 for r in DATA if r[0] == 0)
    assert result.get_net_runtime() > 0 and result.get_job_name() == "test"


def test_no_sink_is_an_error():
    env = StreamExecutionEnvironment()
    env.from_collection([1, 2]).map(lambda x: x)
    with pytest.raises(ValueError, match="no sink"):
        env.execute("empty")


def test_union_and_number_sequence():
    env = StreamExecutionEnvironment(parallelism=2, batch_size=4)
    a = env.from_source(NumberSequenceSource(0, 9))
    b = env.from_collection([100, 101])
    sink = a.union(b.map(lambda x: x * 2)).collect()
    env.execute()
    assert sorted(sink.records()) == list(range(10)) + [200, 202]


def subtask_tagger():
    class Tag(MapFunction):
        def open(self, ctx):
            self.i = ctx.get_index_of_this_subtask()

        def map(self, r):
            return (self.i, r)

    return Tag()


def per_subtask(records, parallelism):
    return [[r for i, r in records if i == s] for s in range(parallelism)]


def test_rebalance_spreads_evenly_and_broadcast_copies():
    env = StreamExecutionEnvironment(parallelism=4, batch_size=5)
    src = env.from_collection(list(range(40)))
    reb = src.rebalance().map(subtask_tagger()).collect()
    bro = src.broadcast().map(subtask_tagger()).collect()
    env.execute()
    parts = per_subtask(reb.records(), 4)
    assert [len(p) for p in parts] == [10, 10, 10, 10]
    assert sorted(sum(parts, [])) == list(range(40))
    for p in per_subtask(bro.records(), 4):
        assert sorted(p) == list(range(40))


def test_key_by_sends_each_key_to_one_subtask_and_custom_partitioning():
    env = StreamExecutionEnvironment(parallelism=3, batch_size=6)
    src = env.from_collection([(i % 7, i) for i in range(70)])
    keyed = src.key_by(0).map(subtask_tagger()).collect()
    custom = src.partition_custom(lambda k, n: k % n, 0).map(subtask_tagger()).collect()
    env.execute()
    owner = {}
    for sub, (k, _) in keyed.records():
        assert owner.setdefault(k, sub) == sub
    assert len(set(owner.values())) > 1
    for sub, (k, _) in custom.records():
        assert sub == k % 3


def test_rescale_and_shuffle_keep_every_record():
    env = StreamExecutionEnvironment(parallelism=2, batch_size=3)
    src = env.from_source(NumberSequenceSource(1, 30))
    a = src.rescale().map(subtask_tagger()).set_parallelism(4).collect()
    b = src.shuffle().map(lambda x: x).set_parallelism(3).collect()
    env.execute()
    assert sorted(r for _, r in a.records()) == list(range(1, 31))
    # rescale: upstream subtask 0 (1..15) feeds downstream 0-1, subtask 1 feeds 2-3
    assert all((sub < 2) == (r <= 15) for sub, r in a.records())
    assert sorted(b.records()) == list(range(1, 31))


def test_forward_needs_equal_parallelism():
    env = StreamExecutionEnvironment(parallelism=2)
    env.from_source(NumberSequenceSource(1, 3)).forward().map(lambda x: x).set_parallelism(3).collect()
    with pytest.raises(ValueError, match="forward partitioning needs equal parallelism"):
        env.execute()


def test_process_function_side_outputs():
    small = OutputTag("small")

    class Split(ProcessFunction):
        def process_element(self, value, ctx):
            if value < 5:
                ctx.output(small, ("small", value))
            else:
                yield value

    env = StreamExecutionEnvironment(batch_size=4)
    main = env.from_collection(list(range(12))).process(Split())
    big = main.collect()
    side = main.get_side_output(small).collect()
    env.execute()
    assert big.records() == list(range(5, 12))
    assert side.records() == [("small", v) for v in range(5)]


def test_collect_to_arrow_and_pandas_and_callback():
    seen = []
    env = StreamExecutionEnvironment(batch_size=3)
    src = env.from_collection([{"id": i, "name": f"n{i}"} for i in range(5)])
    sink = src.collect()
    src.add_sink(seen.append)
    env.execute()
    assert sink.to_arrow().column("name").to_pylist() == [f"n{i}" for i in range(5)]
    assert sink.to_pandas()["id"].tolist() == list(range(5))
    assert seen == sink.records()


def test_bad_arguments_raise_clear_errors():
    env = StreamExecutionEnvironment()
    ds = env.from_collection([1])
    with pytest.raises(ValueError, match="set_parallelism"):
        ds.map(lambda x: x).set_parallelism(0)
    single = CollectionSource([1])  # a source that cannot run in parallel
    single.max_parallelism = 1
    with pytest.raises(ValueError, match="parallelism 1 at most"):
        env.from_source(single).set_parallelism(2)
    with pytest.raises(TypeError, match="sink_to"):
        ds.sink_to(print)
    with pytest.raises(TypeError, match="key_by"):
        ds.key_by(3.5)
    with pytest.raises(ValueError, match="parallelism"):
        StreamExecutionEnvironment(parallelism=0)


def test_key_by_missing_field_names_the_field():
    env = StreamExecutionEnvironment()
    env.from_collection([{"a": 1}]).key_by("b").map(lambda r: r).collect()
    with pytest.raises(ValueError, match="no field 'b'"):
        env.execute()


def test_empty_collection_runs():
    env = StreamExecutionEnvironment()
    sink = env.from_collection([]).map(lambda x: x).collect()
    env.execute()
    assert sink.records() == [] and isinstance(sink, CollectSink)


def test_vectorized_key_selector_matches_record_key_selector():
    env = StreamExecutionEnvironment(parallelism=3, batch_size=5)
    src = env.from_collection(DATA)
    fast = src.key_by(vectorized(lambda b: b["f1"] % 4)).sum(2).collect()
    slow = src.key_by(lambda r: r[1] % 4).sum(2).collect()
    env.execute()
    assert multiset(fast.records()) == multiset(slow.records())


def test_arrow_and_generator_sources():
    import pyarrow as pa

    tables = [pa.table({"id": [i, i + 1], "v": [1.5 * i, 2.0]}) for i in range(0, 8, 2)]
    env = StreamExecutionEnvironment(parallelism=2, batch_size=3)
    arrow = env.from_arrow(tables).filter(vectorized(lambda b: b["id"] % 2 == 0)).collect()
    gen = env.from_iterator(lambda i, n: ((i, j) for j in range(i * 10, i * 10 + 4))).collect()
    env.execute()
    assert sorted(r["id"] for r in arrow.records()) == [0, 2, 4, 6]
    assert sorted(gen.records()) == [(0, 0), (0, 1), (0, 2), (0, 3), (1, 10), (1, 11), (1, 12), (1, 13)]


def test_print_sink_and_union_of_keyed_streams(capsys):
    env = StreamExecutionEnvironment(parallelism=2, batch_size=2)
    a = env.from_collection([(1, "x"), (2, "y")])
    b = env.from_collection([(1, "z")])
    a.key_by(0).union(b.key_by(0)).map(lambda r: r[1]).print("u")
    env.execute()
    lines = capsys.readouterr().out.split("\n")
    assert sorted(line.split("> ")[1] for line in lines if line) == ["'x'", "'y'", "'z'"]
    assert all(line.startswith("u") for line in lines if line)
