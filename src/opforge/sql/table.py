"""A table: named columns of equal length on one device, loaded from Arrow, pandas, Parquet or CSV."""
from __future__ import annotations

import os
from dataclasses import dataclass

import pandas as pd
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import torch

from opforge.sql.column import Column
from opforge.sql.errors import SqlError


@dataclass
class Table:
    names: list[str]
    columns: list[Column]

    @property
    def num_rows(self) -> int:
        return len(self.columns[0]) if self.columns else 0

    def column(self, name: str) -> Column:
        return self.columns[self.names.index(name)]

    @staticmethod
    def from_arrow(t: pa.Table, device) -> "Table":
        # sortedness is checked once here so joins on a table loaded in key order can merge
        return Table(list(t.column_names),
                     [Column.from_arrow(t.column(i), device, n).mark_sorted() for i, n in enumerate(t.column_names)])

    @staticmethod
    def from_pandas(df: pd.DataFrame, device) -> "Table":
        return Table.from_arrow(pa.Table.from_pandas(df, preserve_index=False), device)

    @staticmethod
    def load(obj, device) -> "Table":
        """Accepts a pyarrow.Table, a pandas.DataFrame, or a path to a .parquet / .csv file."""
        if isinstance(obj, pa.Table):
            return Table.from_arrow(obj, device)
        if isinstance(obj, pd.DataFrame):
            return Table.from_pandas(obj, device)
        if isinstance(obj, (str, os.PathLike)):
            path = os.fspath(obj)
            if not os.path.exists(path):
                raise SqlError(f"register: file {path!r} does not exist")
            if path.endswith(".parquet") or os.path.isdir(path):
                return Table.from_arrow(pq.read_table(path), device)
            if path.endswith(".csv"):
                # empty fields are NULL, as DuckDB reads them
                opts = pacsv.ConvertOptions(strings_can_be_null=True)
                return Table.from_arrow(pacsv.read_csv(path, convert_options=opts), device)
            raise SqlError(f"register: {path!r} is neither .parquet nor .csv")
        raise TypeError(f"register: expected a pyarrow.Table, pandas.DataFrame or path, got {type(obj).__name__}")

    def to_arrow(self) -> pa.Table:
        return pa.Table.from_arrays([c.to_arrow() for c in self.columns], names=self.names)

    def to(self, device: torch.device) -> "Table":
        return Table(self.names, [Column(c.values.to(device), None if c.valid is None else c.valid.to(device),
                                         c.type, c.dictionary, c.sorted) for c in self.columns])
