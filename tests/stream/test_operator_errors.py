"""An exception inside a running operator names the operator, its subtask
and, where the operator calls a user function per record, the record and
key (issue 25). The raised error is still an instance of the original type
(so ``except ValueError`` keeps working) and carries it as ``__cause__``."""

import pytest

from opforge import cli
from opforge.stream import (KeyedProcessFunction, StreamExecutionEnvironment, TumblingEventTimeWindows,
                            WatermarkStrategy, vectorized)
from opforge.stream.errors import StreamOperatorError


class Picky(Exception):
    def __init__(self, what):
        super().__init__(f"picky about {what}")
        self.what = what


def _parse(r):
    if r == "x":
        raise ValueError("not a number: 'x'")
    return int(r)


def test_a_map_error_names_operator_subtask_and_record():
    env = StreamExecutionEnvironment(batch_size=2)
    env.from_collection(["1", "2", "x", "4"]).map(_parse).name("parse").collect()
    with pytest.raises(ValueError, match="not a number") as e:
        env.execute()
    err = e.value
    assert isinstance(err, StreamOperatorError)
    assert "operator 'parse' (subtask 0/1)" in str(err) and "record 'x'" in str(err)
    assert type(err.__cause__) is ValueError and str(err.__cause__) == "not a number: 'x'"
    assert err.operator == "parse" and err.record == "x"


class Fails(KeyedProcessFunction):
    def process_element(self, value, ctx):
        if value[1] == 3:
            raise Picky(value)
        yield value


def test_a_keyed_process_error_names_the_key_and_keeps_attributes():
    env = StreamExecutionEnvironment(batch_size=4, parallelism=2)
    env.from_collection([(k, v) for v in range(5) for k in ("a", "b")]).key_by(0).process(Fails()) \
        .name("fails").map(lambda r: r).name("after").collect()
    with pytest.raises(Picky) as e:
        env.execute()
    msg = str(e.value)
    assert "operator 'fails' (subtask " in msg and "key 'a'" in msg and "record ('a', 3)" in msg, msg
    assert "'after'" not in msg  # the upstream operator does not claim it
    assert e.value.what == ("a", 3) and isinstance(e.value.__cause__, Picky)


def test_a_window_function_and_a_vectorized_function_are_named():
    env = StreamExecutionEnvironment(batch_size=4)
    env.from_collection([(1, 2, 3), (1, 0, 4)],
                        WatermarkStrategy.for_monotonous_timestamps().with_timestamp_assigner("f2")) \
        .key_by(0).window(TumblingEventTimeWindows.of(10)) \
        .reduce(lambda a, b: (a[0], a[1] // b[1], b[2])).name("divide").collect()
    with pytest.raises(ZeroDivisionError, match="operator 'divide'.*key 1"):
        env.execute()

    @vectorized
    def boom(batch):
        raise RuntimeError("kernel said no")

    env = StreamExecutionEnvironment(batch_size=4)
    env.from_collection([1, 2]).map(boom).name("vec").collect()
    with pytest.raises(RuntimeError, match="operator 'vec' \\(subtask 0/1\\).*kernel said no"):
        env.execute()


def test_the_cli_prints_the_operator_and_record(tmp_path, capsys):
    failing = tmp_path / "failing.py"
    failing.write_text("def build(env, args):\n"
                       "    return env.from_collection(['1', 'x']).map(int).name('parse')\n")
    assert cli.main(["stream", "run", str(failing), "--device", "cpu"]) == 1
    out = capsys.readouterr().out
    assert "failing.py failed: ValueError" in out and "operator 'parse'" in out and "record 'x'" in out, out
