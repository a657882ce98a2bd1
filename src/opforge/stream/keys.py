"""Keys: what ``key_by`` extracts, and how keys become int64 ids.

A key selector is a column name / tuple position (the fast path: an integer
column is read as a tensor), a ``@vectorized`` function of the batch returning
a tensor, or a plain function of one record. Int keys are their own ids; other
keys (strings, bytes, floats, tuples of those) get ids from a ``KeyCodec``: a
stable hash of the value, the same in every process (a cluster's workers agree
on key groups); the codec, shared by every subtask of the job (and by both
inputs of a connected keyed stream, via a ``KeySpace``), decodes ids back to
the user's keys.
"""

from __future__ import annotations

import hashlib
import struct

import torch

from opforge.stream.functions import field_of, is_vectorized
from opforge.stream.records import Batch


class KeyCodec:
    """Int64 ids for keys that are not int64 tensors: a stable 63-bit hash of the key's value
    (blake2b of a canonical byte form), the same in every process, so that key groups, the
    subtasks they map to and checkpointed state agree between the workers of a cluster and across
    restores. Values Python counts equal (``1``, ``1.0``, ``True``; ``0.0``, ``-0.0``) get one id,
    as one dict key; every NaN is one key (as Flink's ``Double.equals``). Keys of other types
    (frozensets, user objects) get process-local ids by first sight (``local``): a single process
    handles them, a cluster refuses them. Two values on one id (a hash collision) raise."""

    def __init__(self):
        self.ids: dict = {}     # value -> id, a cache (values unequal to themselves, NaN, are not kept)
        self.values: dict = {}  # id -> value, to decode
        self.local: object = None  # a key with a process-local id, if any

    def id_of(self, k) -> int:
        i = self.ids.get(k)
        if i is not None:
            return i
        try:
            data = _canonical(k)
        except _Unstable:
            i = len(self.values)
            while i in self.values:
                i += 1
            self.local = k
        except TypeError:
            raise TypeError(f"key_by: key {k!r} is not hashable") from None
        else:
            i = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little") >> 1
        seen = self.values.get(i, _MISSING)
        if seen is _MISSING:
            self.values[i] = k
        elif not _same(seen, k):
            raise ValueError(f"key_by: keys {seen!r} and {k!r} have the same 63-bit key hash; rename one")
        if k == k:
            self.ids[k] = i
        return i

    def encode(self, keys: list, device) -> torch.Tensor:
        ids, id_of = self.ids, self.id_of
        out = []
        for k in keys:
            try:
                i = ids.get(k)
            except TypeError:
                raise TypeError(f"key_by: key {k!r} is not hashable") from None
            out.append(id_of(k) if i is None else i)
        return torch.tensor(out, dtype=torch.int64, device=device)

    def state(self) -> list:
        """What a checkpoint keeps: ``[ids, values]``."""
        return [list(self.values), list(self.values.values())]

    def learn(self, ids: list, values: list) -> None:
        """Add ids another process gave these values (hashes: the same here)."""
        for i, v in zip(ids, values):
            self.values[i] = v
            if v == v:
                self.ids[v] = i

    def restore(self, ids: list | None, values: list) -> None:
        """Back to a checkpoint's ``state()``; ``ids`` None: a checkpoint of older versions, whose
        ids were dense, by first sight (its state is keyed by them, so they stay)."""
        ids = range(len(values)) if ids is None else ids
        self.values = dict(zip(ids, values))
        self.ids = {v: i for i, v in self.values.items() if v == v}
        self.local = None


class _Unstable(Exception):
    """A key of a type with no canonical byte form."""


_MISSING = object()


def _canonical(k) -> bytes:
    """Equal keys give equal bytes; self-delimiting, so that tuples of them do too."""
    if isinstance(k, bool) or isinstance(k, int):
        s = str(int(k)).encode()
        return b"i" + struct.pack("<I", len(s)) + s
    if isinstance(k, float):
        if k != k:
            return b"n"
        if k.is_integer():
            return _canonical(int(k))
        return b"f" + struct.pack("<d", k)
    if isinstance(k, str):
        s = k.encode("utf-8", "surrogatepass")
        return b"s" + struct.pack("<I", len(s)) + s
    if isinstance(k, bytes):
        return b"b" + struct.pack("<I", len(k)) + k
    if k is None:
        return b"N"
    if isinstance(k, tuple):
        return b"t" + struct.pack("<I", len(k)) + b"".join(_canonical(v) for v in k)
    hash(k)  # unhashable: TypeError
    raise _Unstable


def _same(a, b) -> bool:
    """Equality with every NaN equal to every NaN (tuples too)."""
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


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
        values = self.codec.values
        return [values[i] for i in key_ids.tolist()]

    def of_record(self, record):
        """The key of one record (the reference executor's path)."""
        s = self.selector
        if isinstance(s, (str, int)):
            return field_of(record, s, self.where)
        if is_vectorized(s):
            raise TypeError(f"{self.where}: a vectorized key selector has no record-at-a-time form")
        return s(record)
