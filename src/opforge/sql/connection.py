"""The user-facing API in DuckDB's habits: connect(), register(), sql() -> Relation."""
from __future__ import annotations

import itertools

import pandas as pd
import pyarrow as pa
import torch
from sqlglot import exp

from opforge.sql import plan as P
from opforge.sql.errors import NotSupportedError, SqlError
from opforge.sql.executor import Executor
from opforge.sql.frontend.binder import Binder
from opforge.sql.frontend.parser import parse
from opforge.sql.optimizer import optimize
from opforge.sql.table import Table


def _default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"


class Relation:
    """A planned query; executed on each call to to_arrow / to_pandas / fetchall."""

    def __init__(self, con: "Connection", node: P.Node | None, message: str = ""):
        self._con, self._node, self._message = con, node, message

    @property
    def plan(self) -> P.Node | None:
        return self._node

    @property
    def columns(self) -> list[str]:
        return [] if self._node is None else [o.name for o in self._node.outputs]

    def to_arrow(self) -> pa.Table:
        if self._node is None:
            return pa.table({})
        return Executor(self._con._tables, self._con.device).to_arrow(self._node)

    def to_pandas(self) -> pd.DataFrame:
        return self.to_arrow().to_pandas()

    def fetchall(self) -> list[tuple]:
        t = self.to_arrow()
        cols = [c.to_pylist() for c in t.columns]
        return list(zip(*cols)) if cols else []

    def explain(self) -> str:
        return self._message if self._node is None else P.explain(self._node)

    def __repr__(self) -> str:
        return self.explain()


class Connection:
    def __init__(self, device: str | torch.device | None = None):
        self.device = torch.device(device or _default_device())
        self._tables: dict[str, Table] = {}
        self.views: dict[str, exp.Expression] = {}
        self._cids = itertools.count()

    def register(self, name: str, obj) -> "Connection":
        """Loads a pyarrow.Table, pandas.DataFrame or .parquet/.csv path onto the device under `name`."""
        if not isinstance(name, str) or not name.isidentifier():
            raise ValueError(f"register: name must be an identifier, got {name!r}")
        self._tables[name] = Table.load(obj, self.device)
        return self

    def unregister(self, name: str) -> None:
        self._tables.pop(name, None)
        self.views.pop(name.lower(), None)

    def tables(self) -> list[str]:
        return sorted(list(self._tables) + list(self.views))

    def sql(self, text: str) -> Relation:
        tree = parse(text)
        if isinstance(tree, exp.Create):
            return self._create(tree)
        if isinstance(tree, exp.Drop) and (tree.args.get("kind") or "").upper() == "VIEW":
            target = tree.this if tree.this is not None else (tree.args.get("tables") or [None])[0]
            name = target.name.lower()
            if name not in self.views and not tree.args.get("exists"):
                raise SqlError(f"DROP VIEW: no view named {name!r}")
            self.views.pop(name, None)
            return Relation(self, None, f"dropped view {name}")
        if not isinstance(tree, (exp.Select, exp.Union, exp.Subquery, exp.Intersect, exp.Except)):
            raise NotSupportedError(f"statement {type(tree).__name__} (only SELECT queries and CREATE VIEW)")
        return Relation(self, self.plan(tree))

    def plan(self, tree: exp.Expression) -> P.Node:
        node, _ = Binder(_Catalog(self), self._run_scalar, self._cids).bind_query(tree)
        return optimize(node, self.device)

    def _run_scalar(self, node: P.Node):
        node = optimize(node, self.device)
        t = Executor(self._tables, self.device).to_arrow(node)
        if t.num_rows > 1:
            raise SqlError(f"scalar subquery returned {t.num_rows} rows, expected at most 1")
        if t.num_rows == 0:
            return None
        return t.column(0)[0].as_py()

    def _create(self, tree: exp.Create) -> Relation:
        kind = (tree.args.get("kind") or "").upper()
        if kind != "VIEW":
            raise NotSupportedError(f"CREATE {kind} (only CREATE VIEW)")
        name = tree.this.name.lower() if isinstance(tree.this, exp.Table) else tree.this.this.name.lower()
        if (name in self.views or name in {t.lower() for t in self._tables}) and not tree.args.get("replace"):
            raise SqlError(f"CREATE VIEW: {name!r} already exists")
        query = tree.expression
        self.plan(query)  # validate now: errors surface at CREATE time
        self.views[name] = query
        return Relation(self, None, f"created view {name}")


class _Catalog:
    def __init__(self, con: Connection):
        self.tables = con._tables
        self.views = con.views


def connect(device: str | torch.device | None = None) -> Connection:
    """A new connection; device defaults to cuda when available, else cpu."""
    return Connection(device)
