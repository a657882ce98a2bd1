"""User functions, with Flink's names: ``MapFunction``, ``FilterFunction``,
``FlatMapFunction``, ``ReduceFunction``, ``AggregateFunction``,
``ProcessFunction``, ``KeyedProcessFunction``, ``ProcessWindowFunction``;
plain callables work too.

Two paths. An unmarked function sees one record at a time (the compatible
slow path: one Python call per record). A function marked ``@vectorized``
sees a whole micro-batch (``Batch``: ``batch["price"]`` is a column tensor,
``batch.timestamps`` the event times) and returns one — the fast path. Both
give the same records. What a vectorized function returns:

* map: a ``Batch``, a mapping column name -> tensor/list (names ``f0..fn``
  give tuples, other names dicts, unless ``output=`` names a dataclass), or
  one tensor (bare values); same length as the input;
* filter: a bool tensor, one per row;
* flat_map: a ``Batch`` or mapping of any length; with ``"__row__"`` (the
  input row each output row comes from) rows keep their input's timestamps,
  as the record path's outputs do; ``@vectorized(record_watermarks=True)``:
  whole batches with per-record watermarks (``vectorized``).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable, Mapping

import torch

from opforge.stream.records import Batch, RecordSchema, column_len


def vectorized(fn: Callable | None = None, *, output: type | None = None, record_watermarks: bool = False):
    """Mark ``fn`` (a function or a function object's method owner) as taking
    and returning micro-batches. ``output``: a dataclass the result rows become.
    ``record_watermarks`` (flat_map): with record watermark granularity the
    function takes whole batches whose records carry the watermarks they saw
    (``batch.watermarks``; None at batch granularity) and returns ``"__row__"``,
    so its outputs keep their input row's watermark; without it the engine
    calls it once per run of records that saw the same watermark."""

    def mark(f):
        f.__opforge_vectorized__ = True
        f.__opforge_output__ = output
        f.__opforge_record_watermarks__ = record_watermarks
        return f

    return mark(fn) if fn is not None else mark


def is_vectorized(fn) -> bool:
    return bool(getattr(fn, "__opforge_vectorized__", False))


def batch_result(result, like: Batch, where: str, same_length: bool) -> Batch:
    """A vectorized function's return value as a ``Batch``."""
    if isinstance(result, Batch):
        out = result
    elif isinstance(result, torch.Tensor):
        out = Batch({"f0": result}, like.timestamps, RecordSchema("value", ("f0",)), like.keys)
    elif isinstance(result, Mapping):
        cols = dict(result)
        ts = cols.pop("__timestamp__", None)
        names = tuple(cols)
        if names and names == tuple(f"f{i}" for i in range(len(names))):
            schema = RecordSchema("tuple", names)
        else:
            schema = RecordSchema("dict", names)
        n = column_len(next(iter(cols.values()))) if cols else 0
        if ts is None:
            ts = like.timestamps if same_length else torch.full(
                (n,), -(2**63), dtype=torch.int64, device=like.device)
        out = Batch(cols, ts, schema, like.keys if same_length else None)
    else:
        raise TypeError(f"{where}: a vectorized function must return a Batch, a mapping of "
                        f"columns or a tensor, got {type(result).__name__}")
    for name, col in out.columns.items():
        if same_length and column_len(col) != len(like):
            raise ValueError(f"{where}: column {name!r} has {column_len(col)} rows, expected {len(like)}")
    return out


def with_output_type(batch: Batch, output: type | None) -> Batch:
    if output is None:
        return batch
    if not dataclasses.is_dataclass(output):
        raise TypeError(f"vectorized(output=...): expected a dataclass, got {output!r}")
    names = tuple(f.name for f in dataclasses.fields(output))
    if tuple(batch.columns) != names:
        raise ValueError(f"vectorized(output={output.__name__}): columns {list(batch.columns)} "
                         f"are not the dataclass fields {list(names)}")
    batch.schema = RecordSchema("dataclass", names, output)
    return batch


class Function:
    """Base of function objects: ``open``/``close`` bracket a subtask's life."""

    def open(self, runtime_context: "RuntimeContext") -> None:
        pass

    def close(self) -> None:
        pass


class MapFunction(Function):
    def map(self, value):
        raise NotImplementedError


class FilterFunction(Function):
    def filter(self, value) -> bool:
        raise NotImplementedError


class FlatMapFunction(Function):
    def flat_map(self, value) -> Iterable:
        raise NotImplementedError


class ReduceFunction(Function):
    def reduce(self, value1, value2):
        raise NotImplementedError


class AggregateFunction(Function):
    """Incremental aggregation: one accumulator per key and window."""

    def create_accumulator(self):
        raise NotImplementedError

    def add(self, value, accumulator):
        raise NotImplementedError

    def get_result(self, accumulator):
        raise NotImplementedError

    def merge(self, acc_a, acc_b):
        raise NotImplementedError


class ProcessFunction(Function):
    """``process_element(value, ctx)`` yields outputs; ``ctx.output(tag, v)``
    emits to a side output."""

    def process_element(self, value, ctx) -> Iterable:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx) -> Iterable:
        return ()


class KeyedProcessFunction(ProcessFunction):
    """A ``ProcessFunction`` on a keyed stream: keyed state through
    ``open(runtime_context)`` and timers through ``ctx.timer_service()``."""


class CoProcessFunction(Function):
    """Two inputs (``DataStream.connect``): ``process_element1(value, ctx)`` for
    the first, ``process_element2`` for the second; both yield outputs."""

    def process_element1(self, value, ctx) -> Iterable:
        raise NotImplementedError

    def process_element2(self, value, ctx) -> Iterable:
        raise NotImplementedError

    def on_timer(self, timestamp: int, ctx) -> Iterable:
        return ()


class KeyedCoProcessFunction(CoProcessFunction):
    """A ``CoProcessFunction`` on connected keyed streams: the key's state and
    timers are shared by both inputs (e.g. a join that waits for its match)."""


class ProcessWindowFunction(Function):
    """Full-window processing: ``process(key, context, elements)`` yields the
    outputs of one window; ``context.window()`` is the ``TimeWindow``."""

    def process(self, key, context, elements: Iterable) -> Iterable:
        raise NotImplementedError


class RuntimeContext:
    """What ``open`` receives: the subtask's index and keyed state access."""

    def __init__(self, task_name: str, index: int, parallelism: int, state_backend=None):
        self.task_name = task_name
        self._index = index
        self._parallelism = parallelism
        self._state = state_backend

    def get_index_of_this_subtask(self) -> int:
        return self._index

    def get_number_of_parallel_subtasks(self) -> int:
        return self._parallelism

    def _backend(self, what):
        if self._state is None:
            raise TypeError(f"{self.task_name}: {what} needs a keyed stream (key_by before process)")
        return self._state

    def get_state(self, descriptor):
        return self._backend("get_state").get_state(descriptor)

    def get_list_state(self, descriptor):
        return self._backend("get_list_state").get_state(descriptor)

    def get_map_state(self, descriptor):
        return self._backend("get_map_state").get_state(descriptor)

    def get_reducing_state(self, descriptor):
        return self._backend("get_reducing_state").get_state(descriptor)

    def get_aggregating_state(self, descriptor):
        return self._backend("get_aggregating_state").get_state(descriptor)


# -- columnar aggregations: AggregateFunctions with a vectorized path --------

_OPS = ("sum", "count", "min", "max", "mean")


#: the columns ``Aggregations(with_window=True)`` puts before its aggregations
WINDOW_COLUMNS = ("key", "window_start", "window_end")


class Aggregations(AggregateFunction):
    """Named aggregations of columns, e.g. ``Aggregations(n=("count",),
    total=("sum", "price"), top=("max", "price"))``; ops: sum, count, min,
    max, mean. Results are dict records ``{name: value}`` and, with
    ``with_window=True``, also ``key``, ``window_start``, ``window_end``.

    Works record by record like any ``AggregateFunction``; a window operator
    instead folds a whole micro-batch per (key, window) as segmented
    reductions (the GPU path)."""

    def __init__(self, *, with_window: bool = False, **outputs: tuple):
        if not outputs:
            raise ValueError("Aggregations: give at least one named aggregation, e.g. n=('count',)")
        self.outputs: dict[str, tuple[str, str | None]] = {}
        for name, spec in outputs.items():
            if not isinstance(spec, tuple) or not spec or spec[0] not in _OPS:
                raise ValueError(f"Aggregations: {name}={spec!r}; expected (op, column) with op in {_OPS}")
            if spec[0] != "count" and len(spec) != 2:
                raise ValueError(f"Aggregations: {name}={spec!r} needs a column name")
            self.outputs[name] = (spec[0], spec[1] if len(spec) > 1 else None)
        if with_window:
            for name in WINDOW_COLUMNS:
                if name in self.outputs:
                    raise ValueError(f"Aggregations: the aggregation {name!r} clashes with the window column "
                                     f"{name!r} that with_window=True adds (columns {list(WINDOW_COLUMNS)}); "
                                     "rename the aggregation")
        self.with_window = with_window

    # accumulator: name -> [value, count]
    def create_accumulator(self):
        return {n: [None, 0] for n in self.outputs}

    def add(self, value, accumulator):
        for name, (op, col) in self.outputs.items():
            slot = accumulator[name]
            slot[1] += 1
            if op == "count":
                continue
            v = _field(value, col)
            if slot[0] is None:
                slot[0] = v
            elif op in ("sum", "mean"):
                slot[0] = slot[0] + v
            elif op == "min":
                slot[0] = min(slot[0], v)
            else:
                slot[0] = max(slot[0], v)
        return accumulator

    def merge(self, acc_a, acc_b):
        out = self.create_accumulator()
        for name, (op, _) in self.outputs.items():
            (va, ca), (vb, cb) = acc_a[name], acc_b[name]
            vals = [v for v in (va, vb) if v is not None]
            if not vals:
                v = None
            elif op in ("sum", "mean"):
                v = sum(vals)
            elif op == "min":
                v = min(vals)
            else:
                v = max(vals)
            out[name] = [v, ca + cb]
        return out

    def get_result(self, accumulator):
        res = {}
        for name, (op, col) in self.outputs.items():
            v, c = accumulator[name]
            if op == "sum" and type(v) is int and not -(2**63) <= v < 2**63:
                from opforge.stream.errors import sum_overflow

                raise sum_overflow("Aggregations", name, col, None)  # the window operator names its key
            res[name] = c if op == "count" else (v / c if op == "mean" else v)
        return res


def _field(record, name):
    if isinstance(record, Mapping):
        return record[name]
    if isinstance(record, (tuple, list)) and name.startswith("f") and name[1:].isdigit() \
            and not hasattr(record, "_fields"):
        return record[int(name[1:])]
    if name == "f0" and isinstance(record, (int, float, bool)):
        return record
    return getattr(record, name)


def field_of(record, name, where: str):
    """A record's field by column name (Flink positions ``f0.., ``ints for tuples)."""
    try:
        if isinstance(name, int):
            return record[name] if isinstance(record, (tuple, list)) else _field(record, f"f{name}")
        return _field(record, name)
    except (KeyError, AttributeError, IndexError, TypeError):
        raise ValueError(f"{where}: record {record!r} has no field {name!r}") from None


def as_callable(fn, method: str, where: str) -> Callable:
    """A function object's method (``MapFunction.map``) or the callable itself."""
    if hasattr(fn, method) and not isinstance(fn, type):
        return getattr(fn, method)
    if callable(fn):
        return fn
    raise TypeError(f"{where}: expected a callable or an object with .{method}(), got {type(fn).__name__}")


# -- joins ---------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class TimestampedValue:
    """An output with its own event time (Flink's ``TimestampedValue``). A
    process or co-process function that yields one sets that output's
    timestamp; other outputs carry the timestamp of the record (or timer) being
    processed. Interval joins need it: a pair's time is the later of the two."""

    value: object
    timestamp: int


class JoinFunction(Function):
    """A window join's pair function: ``join(first, second)`` returns one output."""

    def join(self, first, second):
        raise NotImplementedError


class FlatJoinFunction(Function):
    """A window join's pair function that yields any number of outputs."""

    def join(self, first, second) -> Iterable:
        raise NotImplementedError


class CoGroupFunction(Function):
    """``co_group(first, second)``: all records of one key and window from each
    input (either list may be empty), yielding outputs."""

    def co_group(self, first: list, second: list) -> Iterable:
        raise NotImplementedError


class ProcessJoinFunction(Function):
    """An interval join's pair function: ``process_element(left, right, ctx)``
    yields outputs; ``ctx.get_left_timestamp()``, ``ctx.get_right_timestamp()``,
    ``ctx.get_timestamp()`` (the pair's time: the later one) and
    ``ctx.output(tag, value)``."""

    def process_element(self, left, right, ctx) -> Iterable:
        raise NotImplementedError
