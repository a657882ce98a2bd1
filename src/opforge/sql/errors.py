"""Errors raised by the SQL front-end; all subclass ValueError so callers can catch one type."""


class SqlError(ValueError):
    """A query that cannot be run: bad syntax, unknown name, bad types."""


class NotSupportedError(SqlError):
    """A valid SQL construct this engine does not implement: raised instead of a wrong answer."""


class OutOfRangeError(SqlError):
    """Arithmetic whose result does not fit its type (DuckDB's "Out of Range Error"): raised instead of
    a wrapped-around value."""


class ConversionError(SqlError):
    """A CAST of a value the target type cannot hold (DuckDB's "Conversion Error")."""


class MemoryLimitError(SqlError):
    """An operator whose output cannot fit the memory budget (or the free memory): raised before allocating."""
