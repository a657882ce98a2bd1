"""Errors raised by the SQL front-end; all subclass ValueError so callers can catch one type."""


class SqlError(ValueError):
    """A query that cannot be run: bad syntax, unknown name, bad types."""


class NotSupportedError(SqlError):
    """A valid SQL construct this engine does not implement: raised instead of a wrong answer."""
