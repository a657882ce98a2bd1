"""SQL over columnar tables on the device: `import opforge.sql as sql; con = sql.connect(); con.sql(...)`.

The names load on first use (PEP 562), so a process that needs only the storage layer
(``opforge.sql.database``: the kill test's writer) imports no torch."""
import importlib as _importlib

_HOME = {"Connection": "connection", "Relation": "connection", "connect": "connection",
         "ConversionError": "errors", "MemoryLimitError": "errors", "NotSupportedError": "errors",
         "OutOfRangeError": "errors", "SqlError": "errors"}

__all__ = sorted(_HOME)


def __getattr__(name: str):
    if name not in _HOME:
        raise AttributeError(f"module 'opforge.sql' has no attribute {name!r}")
    value = getattr(_importlib.import_module(f"opforge.sql.{_HOME[name]}"), name)
    globals()[name] = value
    return value
