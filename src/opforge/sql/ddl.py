"""In-memory DDL and DML: CREATE TABLE (typed columns, or AS SELECT), INSERT INTO ... VALUES / SELECT,
DROP TABLE. A created table lives on the host as an Arrow table (``MemoryTable.data``); each change
re-registers it with the connection, so queries see it like any registered table and its columns
reach the device when a query first reads them. On a connection to a database folder every change
is committed to it first (``sql/database.py``): a statement that fails, or a process killed during
one, leaves the previous state. A database's table is registered from its Parquet files
(``StoredTable``): queries read the files (chunk by chunk under a memory limit), and its rows reach
the host only when a write rewrites it.

Values are converted to the column's type on insert as DuckDB casts them (numbers rounded half away
from zero into integers and decimals, text parsed into numbers / dates / booleans); a value the type
cannot hold is a ``ConversionError``, a NULL in a NOT NULL column or a repeated PRIMARY KEY / UNIQUE
key a ``ConstraintError``."""
from __future__ import annotations

import datetime
import decimal
from dataclasses import dataclass, field

import pyarrow as pa
import sqlglot
from sqlglot import exp

from opforge.sql.database import Change, Database, TableEntry

from opforge.sql import parquet_write
from opforge.sql import types as T
from opforge.sql.schemas import check_schema, qualified_name
from opforge.sql.errors import ConversionError, NotSupportedError, SqlError


class ConstraintError(SqlError):
    """An insert that breaks a NOT NULL, PRIMARY KEY or UNIQUE constraint (DuckDB's "Constraint Error")."""


_T = exp.DataType.Type
_ARROW = {
    _T.TINYINT: pa.int8(), _T.SMALLINT: pa.int16(), _T.INT: pa.int32(), _T.BIGINT: pa.int64(),
    _T.UTINYINT: pa.int16(), _T.USMALLINT: pa.int32(), _T.UINT: pa.int64(),
    _T.INT128: pa.decimal128(38, 0),  # HUGEINT in 128-bit DECIMAL storage (values to +-(10^38 - 1))
    _T.FLOAT: pa.float32(), _T.DOUBLE: pa.float64(),
    _T.BOOLEAN: pa.bool_(), _T.DATE: pa.date32(),
    _T.VARCHAR: pa.string(), _T.TEXT: pa.string(), _T.CHAR: pa.string(), _T.NCHAR: pa.string(),
    _T.NVARCHAR: pa.string(),
    _T.TIMESTAMP: pa.timestamp("us"), _T.TIMESTAMPNTZ: pa.timestamp("us"), _T.DATETIME: pa.timestamp("us"),
    _T.TIMESTAMPTZ: pa.timestamp("us", "UTC"),
}


def arrow_type(dt: exp.DataType, column: str) -> pa.DataType:
    """The Arrow storage of a declared SQL column type (the types ``sql/types.py`` can hold)."""
    if dt.this == _T.DECIMAL:
        params = [int(p.this.name) for p in dt.expressions]
        precision, scale = (params + [18, 3])[:2] if params else (18, 3)
        if len(params) == 1:
            scale = 0
        if not 1 <= precision <= 38 or not 0 <= scale <= precision:
            raise NotSupportedError(f"column {column}: DECIMAL({precision},{scale}): the width must be 1..38 "
                                    "and the scale 0..width")
        return pa.decimal128(precision, scale)
    if dt.this in (_T.ARRAY, _T.LIST, _T.STRUCT) and dt.expressions:  # LIST / STRUCT (sql/nested.py)
        from opforge.sql.frontend.expressions import sql_type
        return T.to_arrow(sql_type(dt))
    if dt.this not in _ARROW:
        raise NotSupportedError(f"column {column}: type {dt.sql(dialect='duckdb')}")
    return _ARROW[dt.this]


@dataclass
class MemoryTable:
    """A table made by CREATE TABLE: its rows and the constraints inserts must keep."""
    data: pa.Table
    not_null: set[str] = field(default_factory=set)
    unique: list[list[str]] = field(default_factory=list)  # PRIMARY KEY and UNIQUE column sets
    defaults: dict[str, exp.Expression] = field(default_factory=dict)

    def check(self, data: pa.Table, name: str) -> None:
        for col in self.not_null:
            if data.column(col).null_count:
                raise ConstraintError(f"NOT NULL constraint failed: {name}.{col}")
        for cols in self.unique:
            seen = set()
            for key in zip(*(data.column(c).to_pylist() for c in cols)):
                if None in key:
                    continue
                if key in seen:
                    shown = ", ".join(map(str, key))
                    raise ConstraintError(f"duplicate key \"{shown}\" violates the unique constraint on "
                                          f"{name}({', '.join(cols)})")
                seen.add(key)


# ------------------------------------------------------------------------------------------ values
def literal_value(e: exp.Expression):
    """The Python value of a constant expression (numbers with a point as Decimal, to keep their
    digits for DECIMAL columns), or raise LookupError when it is not a plain constant."""
    if isinstance(e, exp.Paren):
        return literal_value(e.this)
    if isinstance(e, exp.Null):
        return None
    if isinstance(e, exp.Boolean):
        return bool(e.this)
    if isinstance(e, exp.Neg):
        v = literal_value(e.this)
        if isinstance(v, (int, decimal.Decimal)) and not isinstance(v, bool):
            return -v
        raise LookupError
    if isinstance(e, exp.Literal):
        if e.is_string:
            return e.this
        text = e.this
        try:
            return int(text)
        except ValueError:
            return decimal.Decimal(text)
    raise LookupError


def _convert_nested(values: list, typ: pa.DataType, column: str) -> pa.Array:
    """A LIST / STRUCT column's values, each element or field converted as a column of its type is."""
    if any(v is not None and not isinstance(v, list if pa.types.is_list(typ) else dict) for v in values):
        bad = next(v for v in values if v is not None and not isinstance(v, (list, dict)))
        raise ConversionError(f"Could not convert {_to_text(bad)!r} to {typ} for column {column}")
    mask = pa.array([v is None for v in values], pa.bool_())
    if pa.types.is_list(typ):
        flat = convert([x for v in values if v is not None for x in v], typ.value_type, column)
        offsets, at = [0], 0
        for v in values:
            at += len(v) if v is not None else 0
            offsets.append(at)
        return pa.ListArray.from_arrays(pa.array(offsets, pa.int32()), flat, type=typ, mask=mask)
    fields = []
    for f in typ:
        names = {k.lower(): k for v in values if v is not None for k in v}
        key = names.get(f.name.lower(), f.name)
        fields.append(convert([None if v is None else v.get(key) for v in values], f.type, f"{column}.{f.name}"))
    return pa.StructArray.from_arrays(fields, fields=list(typ), mask=mask)


def _to_int(v, name):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, int):
        return v
    if isinstance(v, float):
        v = decimal.Decimal(repr(v))
    if isinstance(v, str):
        v = decimal.Decimal(v.strip())
    if isinstance(v, decimal.Decimal):
        if not v.is_finite():
            raise ValueError
        return int(v.quantize(decimal.Decimal(1), rounding=decimal.ROUND_HALF_UP))
    raise TypeError


def _to_decimal(v, scale):
    if isinstance(v, bool):
        v = int(v)
    if isinstance(v, float):
        v = repr(v)
    d = decimal.Decimal(v.strip() if isinstance(v, str) else v)
    if not d.is_finite():
        raise ValueError
    with decimal.localcontext(prec=100):  # 38 digits: beyond the default context's 28
        return d.quantize(decimal.Decimal(1).scaleb(-scale), rounding=decimal.ROUND_HALF_UP)


def _to_bool(v):
    if isinstance(v, str):
        s = v.strip().lower()
        if s in ("true", "t", "1", "yes", "y"):
            return True
        if s in ("false", "f", "0", "no", "n"):
            return False
        raise ValueError
    if isinstance(v, (int, float, decimal.Decimal)):
        return v != 0
    raise TypeError


def _to_text(v):
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, float):
        return repr(v)
    if isinstance(v, datetime.date):
        return v.isoformat()
    return str(v)


def _to_date(v):
    if isinstance(v, datetime.datetime):
        return v.date()
    if isinstance(v, datetime.date):
        return v
    if isinstance(v, str):
        return datetime.date.fromisoformat(v.strip())
    raise TypeError


def _to_timestamp(v):
    if isinstance(v, datetime.datetime):
        return v
    if isinstance(v, datetime.date):
        return datetime.datetime(v.year, v.month, v.day)
    if isinstance(v, str):
        return datetime.datetime.fromisoformat(v.strip())
    raise TypeError


def convert(values: list, typ: pa.DataType, column: str) -> pa.Array:
    """``values`` (Python) as an Arrow array of ``typ``, cast the way DuckDB casts on insert."""
    if pa.types.is_integer(typ):
        fn = _to_int
    elif pa.types.is_floating(typ):
        def fn(v, _):
            if isinstance(v, str):
                return float(v.strip())
            if isinstance(v, (int, float, decimal.Decimal)):
                return float(v)
            raise TypeError
    elif pa.types.is_decimal(typ):
        def fn(v, _):
            return _to_decimal(v, typ.scale)
    elif pa.types.is_boolean(typ):
        def fn(v, _):
            return _to_bool(v)
    elif pa.types.is_string(typ):
        def fn(v, _):
            return _to_text(v)
    elif pa.types.is_date(typ):
        def fn(v, _):
            return _to_date(v)
    elif pa.types.is_timestamp(typ):
        def fn(v, _):
            return _to_timestamp(v)
    elif pa.types.is_list(typ) or pa.types.is_struct(typ):
        return _convert_nested(values, typ, column)
    else:
        raise NotSupportedError(f"column {column}: Arrow type {typ}")
    out = []
    for v in values:
        if v is None:
            out.append(None)
            continue
        try:
            out.append(fn(v, column))
        except (ValueError, TypeError, ArithmeticError):
            raise ConversionError(f"Could not convert {_to_text(v)!r} to {typ} for column {column}") from None
    try:
        return pa.array(out, typ)
    except (pa.ArrowInvalid, OverflowError, TypeError) as e:
        raise ConversionError(f"column {column}: a value does not fit {typ}: {e}") from None


def table_name(target: exp.Expression) -> str:
    """The (lower-case, DuckDB matches names case-insensitively) name of a DDL target."""
    if isinstance(target, exp.Schema):
        target = target.this
    if not isinstance(target, exp.Table):
        raise NotSupportedError(f"DDL target {target.sql()}")
    return qualified_name(target)


class StoredTable(MemoryTable):
    """A database's table: its rows are read from its files only when a write needs them (queries
    read the files themselves), so opening a database reads no table whole."""

    def __init__(self, read, not_null, unique, defaults):
        self._read, self._rows = read, None
        super().__init__(None, not_null, unique, defaults)

    @property
    def data(self) -> pa.Table:
        if self._rows is None:
            self._rows = self._read()
        return self._rows

    @data.setter
    def data(self, value: pa.Table | None) -> None:
        self._rows = value


def schema_of(schema: exp.Schema) -> tuple[pa.Schema, MemoryTable]:
    """The Arrow schema and constraints of CREATE TABLE's column list."""
    fields, table = [], MemoryTable(pa.table({}))
    for item in schema.expressions:
        if isinstance(item, exp.ColumnDef):
            name = item.name
            if item.args.get("kind") is None:
                raise NotSupportedError(f"column {name} without a type")
            fields.append(pa.field(name, arrow_type(item.args["kind"], name)))
            for c in item.args.get("constraints") or []:
                kind = c.args.get("kind")
                if isinstance(kind, exp.NotNullColumnConstraint) and not kind.args.get("allow_null"):
                    table.not_null.add(name)
                elif isinstance(kind, exp.PrimaryKeyColumnConstraint):
                    table.not_null.add(name)
                    table.unique.append([name])
                elif isinstance(kind, exp.UniqueColumnConstraint):
                    table.unique.append([name])
                elif isinstance(kind, exp.DefaultColumnConstraint):
                    table.defaults[name] = kind.this
                else:
                    raise NotSupportedError(f"column constraint {c.sql(dialect='duckdb')}")
        elif isinstance(item, (exp.PrimaryKey, exp.UniqueColumnConstraint)):
            cols = [e.name for e in (item.expressions or (item.this.expressions if item.this else []))]
            if isinstance(item, exp.PrimaryKey):
                table.not_null.update(cols)
            table.unique.append(cols)
        else:
            raise NotSupportedError(f"table constraint {item.sql(dialect='duckdb')}")
    names = [f.name for f in fields]
    if len({n.lower() for n in names}) != len(names):
        raise SqlError(f"CREATE TABLE: a column name appears twice in {names}")
    return pa.schema(fields), table


# -------------------------------------------------------------------------------------- statements
class MemoryCatalog:
    """The connection's CREATE TABLE / INSERT / DROP TABLE statements. ``con`` is the Connection:
    queries (AS SELECT, INSERT ... SELECT, non-constant VALUES) run through ``con.sql``, and every
    change re-registers the table through ``con._put_table``."""

    def __init__(self, con):
        self.con = con
        self.tables: dict[str, MemoryTable] = {}
        self.database: Database | None = None  # set by ``attach``: a persistent connection
        self._files: dict[str, list[str] | None] = {}  # table -> the data files its rows came from

    def _exists(self, name: str) -> bool:
        return name in {t.lower() for t in self.con._tables} or name in self.con.views

    def create(self, tree: exp.Create) -> str:
        name = table_name(tree.this)
        check_schema(self.con.schemas, name, "CREATE TABLE")
        if self._exists(name):
            if tree.args.get("exists"):
                return f"table {name} exists"
            if not tree.args.get("replace"):
                raise SqlError(f"CREATE TABLE: table {name!r} already exists")
        query = tree.expression
        if query is not None:
            if isinstance(tree.this, exp.Schema):
                raise NotSupportedError("CREATE TABLE with a column list AS SELECT")
            data = self.con.sql(query.sql(dialect="duckdb")).to_arrow(dictionary=True)
            # a database's files take the dictionary arrays (decoded as written); memory keeps plain strings
            table = MemoryTable(data if self.database is not None else parquet_write.decoded(data))
        else:
            if not isinstance(tree.this, exp.Schema):
                raise SqlError("CREATE TABLE: expected a column list or AS SELECT")
            schema, table = schema_of(tree.this)
            table.data = schema.empty_table()
        self._persist({name: table})  # OR REPLACE: the old table goes in the same commit
        self.drop_name(name)
        if self.database is not None and query is not None:  # served from the files just written
            self._serve(name, self.database.tables[name])
        else:
            self.tables[name] = table
            self.con._put_table(name, table.data)
        return f"created table {name}"

    def drop(self, tree: exp.Drop) -> str:
        targets = [tree.this] if tree.this is not None else list(tree.args.get("tables") or [])
        names = []
        for target in targets:
            name = table_name(target)
            if name not in {t.lower() for t in self.con._tables}:
                if tree.args.get("exists"):
                    continue
                raise SqlError(f"DROP TABLE: no table named {name!r}")
            names.append(name)
        self._persist({n: None for n in names if n in self.tables})
        for name in names:
            self.drop_name(name)
        return "dropped"

    # ------------------------------------------------------------------------- persistence
    def attach(self, database: Database) -> None:
        """Serves the tables of ``database`` and writes every later change through to it."""
        self.database = database
        self._load_changed()

    def sync(self) -> None:
        """Picks up the commits another connection made to the database since the last statement."""
        if self.database is not None and self.database.refresh():
            self._load_changed()

    def _load_changed(self) -> None:
        db = self.database
        for name in [n for n in self.tables if n not in db.tables]:
            self.drop_name(name)
            self._files.pop(name, None)
        for name, entry in db.tables.items():
            if self._files.get(name) == entry.files and name in self.tables:
                continue
            self.drop_name(name)
            self._serve(name, entry)

    def _serve(self, name: str, entry: TableEntry) -> None:
        """Registers the database's table ``name`` as read from its files (rows on the host only when
        a write needs them: ``StoredTable``)."""
        db = self.database
        defaults = {c: sqlglot.parse_one(text, read="duckdb") for c, text in entry.defaults.items()}
        table = StoredTable(lambda: db.load(name), set(entry.not_null), [list(u) for u in entry.unique], defaults)
        self.tables[name] = table
        self._files[name] = list(entry.files)
        if entry.files and self.con.cluster is None:  # queries read the files (chunk by chunk under a limit)
            self.con._put_stored(name, db.parquet_files(name))
        else:
            self.con._put_table(name, table.data)

    def _persist(self, tables: dict[str, MemoryTable | None], appended: pa.Table | None = None) -> None:
        """Commits the tables' new contents (None: dropped) to the database, when there is one;
        ``appended``: the rows an INSERT added to the one table given."""
        if self.database is None or not tables:
            return
        changes = {}
        for name, t in tables.items():
            changes[name] = None if t is None else Change(
                t.data, appended, set(t.not_null), [list(u) for u in t.unique],
                {c: e.sql(dialect="duckdb") for c, e in t.defaults.items()})
        self.database.commit(changes)
        for name in tables:
            entry = self.database.tables.get(name)
            self._files[name] = list(entry.files) if entry is not None else None

    def drop_name(self, name: str) -> None:
        self.tables.pop(name, None)
        self.con.views.pop(name, None)
        for t in [t for t in self.con._tables if t.lower() == name]:
            self.con.unregister(t)

    def change(self, tree: exp.Expression) -> int:
        """INSERT / UPDATE / DELETE; returns the rows changed (DuckDB's answer to them)."""
        if isinstance(tree, exp.Insert):
            return self.insert(tree)
        if isinstance(tree, exp.Delete):
            return self.delete(tree)
        return self.update(tree)

    def _target(self, target: exp.Expression, verb: str) -> tuple[str, MemoryTable]:
        name = table_name(target)
        table = self.tables.get(name)
        if table is None:
            if name in {t.lower() for t in self.con._tables}:
                statement = verb.split()[0].capitalize()  # the construct's name, as other NotSupportedErrors give it
                raise NotSupportedError(f"statement {statement} on the registered table {name!r} "
                                        "(only tables made by CREATE TABLE change)")
            raise SqlError(f"{verb}: unknown table {name!r}")
        return name, table

    def _store(self, name: str, table: MemoryTable, data: pa.Table, appended: pa.Table | None = None) -> None:
        """Replaces the table's rows by ``data`` (``appended``: the rows an INSERT added); the
        database commit comes first, so a failed write changes nothing."""
        table.check(data, name)
        self._persist({name: MemoryTable(data, table.not_null, table.unique, table.defaults)}, appended)
        table.data = data
        self.con._put_table(name, data)

    def _query(self, query: exp.Expression, with_: exp.Expression | None) -> pa.Table:
        if isinstance(query, exp.Subquery):
            query = query.this
        if with_ is not None:
            query = query.copy()
            query.set("with_", with_)
        return self.con.sql(query.sql(dialect="duckdb")).to_arrow()

    def _count(self, target: exp.Expression, where: exp.Expression | None, with_) -> int:
        q = exp.select("count(*)").from_(target.copy())
        if where is not None:
            q = q.where(where.copy())
        return self._query(q, with_).column(0)[0].as_py()

    def delete(self, tree: exp.Delete) -> int:
        if tree.args.get("using") or tree.args.get("returning"):
            raise NotSupportedError("DELETE ... USING / RETURNING")
        name, table = self._target(tree.this, "DELETE FROM")
        with_ = tree.args.get("with_")
        where = tree.args.get("where")
        if where is None:
            n = table.data.num_rows
            self._store(name, table, table.data.schema.empty_table())
            return n
        n = self._count(tree.this, where.this, with_)
        # the rows whose condition is false or NULL stay
        cond = exp.Coalesce(this=exp.paren(where.this.copy()), expressions=[exp.false()])
        keep = exp.select("*").from_(tree.this.copy()).where(exp.Not(this=cond))
        self._store(name, table, self._typed(table, self._query(keep, with_)))
        return n

    def update(self, tree: exp.Update) -> int:
        if tree.args.get("from") or tree.args.get("from_") or tree.args.get("returning"):
            raise NotSupportedError("UPDATE ... FROM / RETURNING")
        name, table = self._target(tree.this, "UPDATE")
        with_ = tree.args.get("with_")
        where = tree.args.get("where")
        lower = {n.lower(): n for n in table.data.schema.names}
        new: dict[str, exp.Expression] = {}
        for eq in tree.expressions:
            col = eq.this.name.lower()
            if col not in lower:
                raise SqlError(f"UPDATE {name}: table has no column {eq.this.name!r}")
            value = eq.expression
            if isinstance(value, (exp.Var, exp.Column)) and value.name.upper() == "DEFAULT":
                value = table.defaults.get(lower[col], exp.null())
            new[lower[col]] = value
        items = []
        for col in table.data.schema.names:
            ref = exp.column(col, quoted=True)
            value = new.get(col)
            if value is None:
                items.append(ref)
                continue
            if where is not None:
                value = exp.Case(ifs=[exp.If(this=exp.paren(where.this.copy()), true=exp.paren(value.copy()))],
                                 default=ref)
            items.append(exp.alias_(value, col, quoted=True))
        n = self._count(tree.this, where.this if where is not None else None, with_)
        data = self._query(exp.select(*items).from_(tree.this.copy()), with_)
        self._store(name, table, self._typed(table, data))
        return n

    @staticmethod
    def _typed(table: MemoryTable, data: pa.Table) -> pa.Table:
        schema = table.data.schema
        arrays = [c if c.type == f.type else convert(c.to_pylist(), f.type, f.name)
                  for c, f in zip(parquet_write.decoded(data).columns, schema)]
        return pa.Table.from_arrays(arrays, schema=schema)

    def insert(self, tree: exp.Insert) -> int:
        """Appends the rows; returns how many."""
        if tree.args.get("alternative") or tree.args.get("conflict") or tree.args.get("overwrite"):
            raise NotSupportedError("INSERT OR REPLACE / ON CONFLICT")
        if tree.args.get("returning"):
            raise NotSupportedError("INSERT ... RETURNING")
        name, table = self._target(tree.this, "INSERT INTO")
        schema = table.data.schema
        targets = schema.names
        if isinstance(tree.this, exp.Schema):
            lower = {n.lower(): n for n in schema.names}
            targets = []
            for ident in tree.this.expressions:
                if ident.name.lower() not in lower:
                    raise SqlError(f"INSERT INTO {name}: table has no column {ident.name!r}")
                targets.append(lower[ident.name.lower()])
        columns = self._source_columns(tree.expression, len(targets), name, tree.args.get("with_"))
        n = len(columns[0]) if columns else 0
        given = dict(zip(targets, columns))
        arrays = []
        for f in schema:
            if f.name in given:
                values = given[f.name]
            elif f.name in table.defaults:
                values = [literal_value(table.defaults[f.name])] * n
            else:
                values = [None] * n
            arrays.append(convert(values, f.type, f.name))
        new = pa.Table.from_arrays(arrays, schema=schema)
        self._store(name, table, pa.concat_tables([table.data, new]), appended=new)
        return n

    def _source_columns(self, source: exp.Expression, width: int, name: str, with_) -> list[list]:
        """The inserted rows as Python columns: VALUES constants directly, anything else through a query."""
        if isinstance(source, exp.Values):
            rows = []
            for tup in source.expressions:
                items = tup.expressions if isinstance(tup, exp.Tuple) else [tup]
                if len(items) != width:
                    raise SqlError(f"INSERT INTO {name}: expected {width} values, got {len(items)}")
                try:
                    rows.append([literal_value(e) for e in items])
                except LookupError:
                    select = "SELECT " + ", ".join(e.sql(dialect="duckdb") for e in items)
                    rows.append(list(self.con.sql(select).fetchall()[0]))
            return [list(c) for c in zip(*rows)] if rows else [[] for _ in range(width)]
        data = self._query(source, with_)
        if data.num_columns != width:
            raise SqlError(f"INSERT INTO {name}: expected {width} columns, the query gives {data.num_columns}")
        return [c.to_pylist() for c in data.columns]

