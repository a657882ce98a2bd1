"""SQL over columnar tables on the device: `import opforge.sql as sql; con = sql.connect(); con.sql(...)`."""
from opforge.sql.connection import Connection, Relation, connect
from opforge.sql.errors import ConversionError, MemoryLimitError, NotSupportedError, OutOfRangeError, SqlError

__all__ = ["Connection", "ConversionError", "MemoryLimitError", "NotSupportedError", "OutOfRangeError", "Relation", "SqlError",
           "connect"]
