"""Keys: what ``key_by`` extracts, and how keys become int64 ids.

A key selector is a column name / tuple position (the fast path: an integer
column is read as a tensor), a ``@vectorized`` function of the batch returning
a tensor, or a plain function of one record. Int keys are their own ids; other
keys (strings, tuples, floats) get dense ids from a ``KeyCodec``, shared by
every subtask of the job (and by both inputs of a connected keyed stream, via
a ``KeySpace``), so that ids decode back to the user's keys.
"""

from __future__ import annotations

import torch

from opforge.stream.functions import field_of, is_vectorized
from opforge.stream.records import Batch


class KeyCodec:
    """Dense int64 ids for keys that are not int64 tensors, by first sight."""

    def __init__(self):
        self.ids: dict = {}
        self.values: list = []

    def encode(self, keys: list, device) -> torch.Tensor:
        ids = self.ids
        out = []
        for k in keys:
            i = ids.get(k)
            if i is None:
                try:
                    i = ids[k] = len(self.values)
                except TypeError:
                    raise TypeError(f"key_by: key {k!r} is not hashable") from None
                self.values.append(k)
            out.append(i)
        return torch.tensor(out, dtype=torch.int64, device=device)


class KeySpace:
    """How keys become ids, shared by the key selectors whose keys must meet
    (both inputs of a connected keyed stream): int keys are their own ids,
    any other keys go through one ``KeyCodec``."""

    def __init__(self):
        self.codec = KeyCodec()
        self.identity: bool | None = None  # decided by the first keys seen


class KeySelector:
    def __init__(self, selector, where: str = "key_by", space: KeySpace | None = None):
        if not (isinstance(selector, (str, int)) or callable(selector)):
            raise TypeError(f"{where}: expected a column name, a position or a callable, "
                            f"got {type(selector).__name__}")
        self.selector = selector
        self.where = where
        self.space = space or KeySpace()

    @property
    def codec(self) -> KeyCodec:
        return self.space.codec

    @property
    def identity(self) -> bool | None:
        return self.space.identity

    def _raw(self, batch: Batch):
        s = self.selector
        if isinstance(s, (str, int)):
            name = s if isinstance(s, str) else f"f{s}"
            if batch.schema is not None and batch.schema.kind == "value" and isinstance(s, int):
                name = "f0"
            if name not in batch.columns:
                raise ValueError(f"{self.where}: the records have no field {s!r} "
                                 f"(fields: {list(batch.columns)})")
            return batch.columns[name]
        if is_vectorized(s):
            return s(batch)
        return [s(r) for r in batch.records()]

    def python_or_tensor(self, batch: Batch):
        return self._raw(batch)

    def key_ids(self, batch: Batch) -> torch.Tensor:
        if len(batch) == 0:
            return torch.empty(0, dtype=torch.int64, device=batch.device)
        raw = self._raw(batch)
        if isinstance(raw, torch.Tensor):
            ints = raw.dtype in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)
            vals = raw if ints else raw.tolist()
        else:
            ints = all(type(k) is int for k in raw)
            vals = raw
        space = self.space
        if space.identity is None:
            space.identity = ints
        if space.identity != ints:
            raise TypeError(f"{self.where}: keys changed type mid-stream "
                            f"({'int' if space.identity else 'non-int'} keys before, now {vals[:1]!r})")
        if ints:
            if isinstance(vals, torch.Tensor):
                return vals.to(torch.int64)
            try:
                return torch.tensor(vals, dtype=torch.int64, device=batch.device)
            except RuntimeError:
                raise TypeError(f"{self.where}: int keys must fit in int64") from None
        return self.codec.encode(vals.tolist() if isinstance(vals, torch.Tensor) else vals, batch.device)

    def decode(self, key_id: int):
        return key_id if self.identity else self.codec.values[key_id]

    def decode_many(self, key_ids: torch.Tensor):
        if self.identity:
            return key_ids
        return [self.codec.values[i] for i in key_ids.tolist()]

    def of_record(self, record):
        """The key of one record (the reference executor's path)."""
        s = self.selector
        if isinstance(s, (str, int)):
            return field_of(record, s, self.where)
        if is_vectorized(s):
            raise TypeError(f"{self.where}: a vectorized key selector has no record-at-a-time form")
        return s(record)
