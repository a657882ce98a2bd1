"""Errors a running stream job raises about its data."""

from __future__ import annotations

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


class StreamOverflowError(OverflowError):
    """An integer aggregation whose exact result does not fit its int64
    column. Flink's ``long`` sums wrap silently; opforge raises instead of
    emitting a wrong result. ``aggregation`` / ``column`` name the sum."""

    def __init__(self, message: str, aggregation: str | None = None, column=None):
        super().__init__(message)
        self.aggregation, self.column = aggregation, column


def sum_overflow(where: str, name: str, column, key, window: str = "") -> StreamOverflowError:
    """The error for the sum ``name`` of ``column`` (``key`` None: not known here)."""
    of = "" if key is None else f" of key {key!r}"
    at = f", {window}" if window else ""
    return StreamOverflowError(
        f"{where}: aggregation {name!r} = sum({column!r}){of}{at} exceeds the int64 range "
        f"[-2**63, 2**63 - 1]; aggregate a float column (or smaller values) instead", name, column)


def window_overflow(where: str, error: StreamOverflowError, key, window) -> StreamOverflowError:
    """``error`` (from ``Aggregations.get_result``) with the operator, key and window named."""
    return sum_overflow(where, error.aggregation, error.column, key, f"window [{window.start}, {window.end})")


class StreamOperatorError(Exception):
    """An exception raised inside a running operator, with where it happened:
    ``operator`` (its name), ``subtask`` / ``parallelism`` and, when the
    operator called a user function per record, the ``record`` and its
    ``key`` (else None). The error a job raises is an instance of this class
    *and* of the original exception's type (``except ValueError`` still
    catches a ``ValueError`` from a map function), carries the original's
    attributes, and keeps the original as ``__cause__`` (PyFlink names the
    failing operator the same way)."""

    operator: str | None = None
    subtask: int | None = None
    parallelism: int | None = None
    record = None
    key = None

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


_NOTHING = object()
_WRAPPERS: dict[type, type] = {}


def at_record(exc: BaseException, record, key=_NOTHING) -> BaseException:
    """Note on ``exc`` the record (and key) a user function failed on; the
    executor's ``operator_error`` puts them in the message. Returns ``exc``."""
    if not isinstance(exc, StreamOperatorError) and "__opforge_record__" not in getattr(exc, "__dict__", {}):
        try:
            exc.__opforge_record__ = (record, key)
        except (AttributeError, TypeError):
            pass
    return exc


def _short(value, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[:limit] + "..."


def _wrapper(base: type) -> type:
    cls = _WRAPPERS.get(base)
    if cls is None:
        try:
            cls = type(base.__name__, (StreamOperatorError, base), {"__module__": base.__module__})
        except TypeError:  # a base whose layout cannot be combined
            cls = StreamOperatorError
        _WRAPPERS[base] = cls
    return cls


def operator_error(exc: Exception, name: str, subtask: int, parallelism: int) -> Exception:
    """``exc`` raised inside operator ``name``'s subtask, as the error the job
    raises (``raise operator_error(...) from exc``); an error already
    attributed to an operator (a downstream one) is returned as it is."""
    if isinstance(exc, StreamOperatorError):
        return exc
    record, key = exc.__dict__.get("__opforge_record__", (_NOTHING, _NOTHING)) \
        if hasattr(exc, "__dict__") else (_NOTHING, _NOTHING)
    where = [f"operator {name!r} (subtask {subtask}/{parallelism})"]
    if key is not _NOTHING:
        where.append(f"key {_short(key)}")
    if record is not _NOTHING:
        where.append(f"record {_short(record)}")
    message = f"{', '.join(where)}: {type(exc).__name__}: {exc}"
    cls = _wrapper(type(exc))
    try:
        err = cls.__new__(cls)
        err.__dict__.update({k: v for k, v in getattr(exc, "__dict__", {}).items() if k != "__opforge_record__"})
        err.args = (message,)
        str(err)
    except Exception:  # an exception type that cannot be built bare
        err = StreamOperatorError(message)
    err.operator, err.subtask, err.parallelism = name, subtask, parallelism
    err.record = None if record is _NOTHING else record
    err.key = None if key is _NOTHING else key
    return err
