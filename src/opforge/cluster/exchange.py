"""Moving SQL batches between workers over the cluster's process group (``opforge.distributed``).

A batch is a dict of ``Column``s (values, validity, and for strings and LIST / STRUCT values a sorted
dictionary the values are codes into). An exchange is two collectives, whatever the columns: a
fixed cost per exchange (a collective's latency, a host sync) is what a query of small batches
pays most, and a query makes tens of exchanges (issue #29).

1. **header**: one all-gather of each worker's row counts (per destination for a shuffle), which
   columns hold NULLs, and for each coded column a fingerprint and the size of its dictionary, plus
   a fingerprint of the columns' ids, dtypes and shapes (workers that disagree fail together with a
   ``ValueError``);
2. **payload**: one all-to-all (shuffle) or all-gather (gather) of bytes. Every row is packed into
   one byte row (each column's value bytes, then a validity byte for a column that holds a NULL on
   some worker) so all columns move together; the dictionaries that differ between workers (each
   worker codes against the dictionary of the rows it holds) travel after the rows.

A receiver merges the dictionaries it got, in worker order, into one sorted dictionary (the engine's
value order is code order, so it is the same on every worker) and re-codes each sender's rows.

* :func:`shuffle_rows`: row i to worker ``dest[i]`` (a partitioned join, a group-by on keys);
* :func:`gather_rows`: every worker gets every row (a broadcast build side, a final sort);
* :func:`key_dest`: the destination of each row from a hash of key columns that is the same for
  equal values whatever their storage (string codes, int widths, NULLs).
"""
from __future__ import annotations

import hashlib
import math
import pickle
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import torch
import torch.distributed as dist

import opforge.distributed as D
from opforge.distributed.collectives import exchange, guard
from opforge.sql import types as T
from opforge.sql.column import ArrowWords, Column, arrow_dictionary, merge_dictionaries
from opforge.sql.expr import Batch
from opforge.sql.outofcore.partition import dictionary_hashes

_NULL_KEY = -0x5EED  # the hash input of a NULL key: every NULL lands on one worker


def key_bits(col: Column) -> torch.Tensor:
    """An int64 per row, equal for equal SQL values (strings and LIST / STRUCT values by content:
    each worker codes its own; integral floats as ints)."""
    v = col.values
    if T.is_coded(col.type):
        bits = dictionary_hashes(col.dictionary or ()).to(v.device)[v.long()] if len(v) and col.dictionary else v.long()
    elif v.dtype.is_floating_point:
        x = v.double()
        integral = x == torch.round(x)
        bits = torch.where(integral, x.clamp(-2.0 ** 62, 2.0 ** 62).long(), (x + 0.0).view(torch.int64))
    else:
        bits = v.long()
    if col.valid is not None:
        bits = torch.where(col.valid, bits, torch.full_like(bits, _NULL_KEY))
    return bits


def key_dest(cols: list[Column], world: int) -> torch.Tensor:
    """The worker of each row: a hash of its key columns (``opforge.distributed.hash_partition``)."""
    return D.hash_partition([key_bits(c) for c in cols], world)


# A dictionary's bytes on the wire and their fingerprint, by identity: a table's columns and every
# column derived from them share one dictionary tuple, exchanged again by each query that moves it.
# The tuple is kept with them (its id is not reused while it is here); at most _WIRE_CACHE_BYTES.
_WIRE_DICTIONARIES: OrderedDict[int, tuple[tuple, bytes, int]] = OrderedDict()
_WIRE_CACHE_BYTES = 256 << 20
_ARROW, _PICKLE = b"A", b"P"  # a dictionary's first byte on the wire: how the rest is encoded


def _dictionary_wire(words: tuple) -> tuple[bytes, int]:
    """A dictionary's bytes and a 64-bit fingerprint of them. Strings travel as an Arrow array
    (IPC; no Python string made on either side), LIST / STRUCT values pickled (they only travel
    between this group's workers, never to disk)."""
    hit = _WIRE_DICTIONARIES.get(id(words))
    if hit is not None and hit[0] is words:
        _WIRE_DICTIONARIES.move_to_end(id(words))
        return hit[1], hit[2]
    if isinstance(words, ArrowWords) or (words and isinstance(words[0], str)):
        sink = pa.BufferOutputStream()
        batch = pa.record_batch([arrow_dictionary(words)], names=["w"])
        with pa.ipc.new_stream(sink, batch.schema) as writer:
            writer.write_batch(batch)
        data = _ARROW + sink.getvalue().to_pybytes()
    else:
        data = _PICKLE + pickle.dumps(words, protocol=pickle.HIGHEST_PROTOCOL)
    fingerprint = int.from_bytes(hashlib.blake2b(data, digest_size=8).digest(), "little", signed=True)
    if len(data) <= _WIRE_CACHE_BYTES:
        _WIRE_DICTIONARIES[id(words)] = (words, data, fingerprint)
        while sum(len(e[1]) for e in _WIRE_DICTIONARIES.values()) > _WIRE_CACHE_BYTES:
            _WIRE_DICTIONARIES.popitem(last=False)
    return data, fingerprint


# A coded column's dictionary of at least this many words travels with only the words its rows use
# when they use at most half of them.
COMPACT_WORDS = 1 << 16


def compacted(col: Column) -> Column:
    """``col`` with a dictionary of only the words its rows use, when that is a large saving. Why:
    a column keeps its table's whole dictionary through filters and joins (TPC-H q10's 20 result
    rows carried 750 K customer comments per worker), and every worker's dictionary is sent to
    the others and merged there."""
    words = col.dictionary
    if not words or len(words) < COMPACT_WORDS:
        return col
    codes = col.values.long()
    used = torch.unique(codes if col.valid is None else codes[col.valid])  # sorted
    if 2 * len(used) > len(words):
        return col
    at = used.cpu().numpy()
    if isinstance(words, ArrowWords):
        kept = ArrowWords(words.arrow.take(pa.array(at)))
    else:
        kept = tuple(words[i] for i in at.tolist())
    # a NULL row's code can be anything: clamped to a word
    new = torch.searchsorted(used, codes).clamp_(max=max(len(used) - 1, 0))
    return Column(new.to(col.values.dtype), col.valid, col.type, kept)


def _dictionary_from_wire(data: bytes):
    if data[:1] == _ARROW:
        return ArrowWords(pa.ipc.open_stream(data[1:]).read_all().column(0).combine_chunks())
    return pickle.loads(data[1:])


class _Wire:
    """A batch's columns as the byte rows and dictionaries an exchange moves."""

    def __init__(self, batch: Batch):
        if any(T.is_coded(c.type) for c in batch.cols.values()):
            batch = Batch({cid: compacted(c) if T.is_coded(c.type) else c for cid, c in batch.cols.items()},
                          batch.n, batch.device)
        self.batch = batch
        self.cids = sorted(batch.cols)  # one column order on every worker
        cols = [batch.cols[c] for c in self.cids]
        self.coded = [i for i, c in enumerate(cols) if T.is_coded(c.type)]
        self.widths = [c.values.element_size() * math.prod(c.values.shape[1:]) for c in cols]
        self.words = {i: cols[i].dictionary or () for i in self.coded}
        self.dicts = {i: _dictionary_wire(w) for i, w in self.words.items()}
        self.signature = ";".join(f"{cid}:{str(c.values.dtype)[6:]}{list(c.values.shape[1:])}"
                                  for cid, c in zip(self.cids, cols))

    def facts(self) -> list[int]:
        """This worker's part of the header after its row counts: per column whether it holds a
        NULL; per coded column its dictionary's fingerprint and size."""
        nulls = [int(self.batch.cols[c].valid is not None) for c in self.cids]
        return nulls + [x for i in self.coded for x in (self.dicts[i][1], len(self.dicts[i][0]))]

    def read(self, facts: torch.Tensor) -> None:
        """From every worker's facts (``[world, len(facts())]``): the columns that carry a validity
        byte, the coded columns whose dictionaries differ, and each worker's dictionary bytes."""
        k = len(self.cids)
        self.masked = [bool(facts[:, i].any()) for i in range(k)]
        prints = facts[:, k::2]
        self.differ = [i for j, i in enumerate(self.coded) if bool((prints[:, j] != prints[0, j]).any())]
        sizes = facts[:, k + 1::2]
        self.dict_sizes = [[int(sizes[r, self.coded.index(i)]) for i in self.differ] for r in range(facts.shape[0])]
        self.row_bytes = sum(self.widths) + sum(self.masked)

    def rows(self) -> torch.Tensor:
        """``[n, row_bytes]`` uint8: each row's column bytes, then its validity bytes."""
        n = self.batch.n
        parts = []
        for cid, width in zip(self.cids, self.widths):
            v = self.batch.cols[cid].values.contiguous()
            parts.append((v.view(torch.uint8) if v.dtype != torch.bool else v.to(torch.uint8)).reshape(n, width))
        for cid, masked in zip(self.cids, self.masked):
            if masked:
                parts.append(self.batch.cols[cid].valid_mask().to(torch.uint8).reshape(n, 1))
        if not parts:
            return torch.zeros((n, 0), dtype=torch.uint8, device=self.batch.device)
        return torch.cat(parts, dim=1)

    def dictionaries(self, device) -> torch.Tensor:
        """This worker's dictionaries that differ from another worker's, as bytes."""
        data = b"".join(self.dicts[i][0] for i in self.differ)
        return torch.frombuffer(bytearray(data), dtype=torch.uint8).to(device) if data else \
            torch.zeros(0, dtype=torch.uint8, device=device)

    def unpack(self, got: torch.Tensor, per_source: list[int], dicts: list[bytes | None], device) -> Batch:
        """The batch from received byte rows (``per_source[r]`` rows from worker r, in worker
        order) and each worker's dictionary bytes (None: this worker's own)."""
        m = int(got.shape[0])
        cols, at = {}, 0
        masks_at = sum(self.widths)
        for j, (cid, width) in enumerate(zip(self.cids, self.widths)):
            like = self.batch.cols[cid]
            raw = got[:, at: at + width].reshape(-1)  # a copy unless the column is the whole row
            at += width
            if like.values.dtype == torch.bool:
                values = raw.bool()
            else:
                if raw.storage_offset() % like.values.element_size():  # a view needs an aligned start
                    raw = raw.clone()
                values = raw.view(like.values.dtype).reshape((m,) + tuple(like.values.shape[1:]))
            valid = None
            if self.masked[j]:
                valid = got[:, masks_at].bool()
                masks_at += 1
                if bool(valid.all()):
                    valid = None
            cols[cid] = Column(values, valid, like.type, like.dictionary)
        if self.differ:
            self._recode(cols, per_source, dicts, device)
        return Batch(cols, m, self.batch.device)

    def _recode(self, cols: dict, per_source: list[int], dicts: list[bytes | None], device) -> None:
        """Each differing coded column against the merge of every worker's dictionary (worker order)."""
        words = []  # per worker, its dictionary of each differing column
        for r, data in enumerate(dicts):
            ends = np.cumsum([0] + self.dict_sizes[r])
            words.append([self.words[i] for i in self.differ] if data is None else
                         [_dictionary_from_wire(data[a:b]) for a, b in zip(ends[:-1], ends[1:])])
        rows_from = torch.tensor(per_source, dtype=torch.int64)
        for j, i in enumerate(self.differ):
            cid, col = self.cids[i], cols[self.cids[i]]
            merged, maps = merge_dictionaries(*(w[j] for w in words), device=device)
            if not merged:  # no words anywhere: every row is NULL
                cols[cid] = Column(torch.zeros_like(col.values), col.valid, col.type, merged)
                continue
            new_code = torch.from_numpy(np.concatenate(maps)).to(device)  # worker r's codes from its base on
            base = torch.from_numpy(np.cumsum([0] + [len(w[j]) for w in words[:-1]]))
            codes = col.values.long() + torch.repeat_interleave(base, rows_from).to(device)
            if col.valid is not None:  # a NULL row's code can be anything: never looked up
                codes = torch.where(col.valid, codes, 0)
            cols[cid] = Column(new_code[codes].to(col.values.dtype), col.valid, col.type, merged)


def shuffle_rows(batch: Batch, dest: torch.Tensor, group=None) -> Batch:
    """Row i of ``batch`` to worker ``dest[i]``; the rows this worker receives (worker order, each
    sender's in its order). Collective: a header all-gather and one all-to-all."""
    where = "opforge.cluster.shuffle_rows"
    world, me = dist.get_world_size(group), dist.get_rank(group)
    order, counts = D.partition(dest, world)
    wire = _Wire(batch)
    table = exchange(where, "rows per worker and columns", counts.tolist() + wire.facts(), wire.signature, group)
    recv_rows = table[:, me].tolist()
    if not batch.cols:  # no columns (COUNT(*) over a projection of nothing): row counts only
        return Batch({}, sum(recv_rows), batch.device)
    wire.read(table[:, world:])
    dev = D.device(group)
    rows = wire.rows().index_select(0, order.to(batch.device)).to(dev)
    send_rows = counts.tolist()
    mine = wire.dictionaries(dev)
    row_bytes = wire.row_bytes
    if mine.numel():  # the rows for each worker, then (to the others) this worker's dictionaries
        pieces = []
        for d, block in enumerate(torch.split(rows.reshape(-1), [c * row_bytes for c in send_rows])):
            pieces += [block] if d == me else [block, mine]
        send = torch.cat(pieces)
    else:
        send = rows.reshape(-1)
    send_sizes = [c * row_bytes + (mine.numel() if d != me else 0) for d, c in enumerate(send_rows)]
    recv_sizes = [c * row_bytes + (sum(wire.dict_sizes[s]) if s != me else 0) for s, c in enumerate(recv_rows)]
    out = torch.empty(sum(recv_sizes), dtype=torch.uint8, device=dev)
    moved = int(table[:, :world].sum()) * row_bytes + sum(map(sum, wire.dict_sizes)) * (world - 1)
    if moved:  # the same on every worker (a worker with nothing to move still takes part)
        with guard(where, "the payload all-to-all", group):
            dist.all_to_all_single(out, send, recv_sizes, send_sizes, group=group)
    return _received(wire, out, recv_rows, recv_sizes, me, batch.device)


def gather_rows(batch: Batch, group=None, limit: int | None = None) -> Batch | None:
    """Every worker's rows, in worker order, on every worker. Collective: a header all-gather and
    one all-gather of the payload. ``limit``: None instead when the rows of every worker together
    take more bytes on the wire than this (known from the header: the payload is not sent)."""
    where = "opforge.cluster.gather_rows"
    me = dist.get_rank(group)
    wire = _Wire(batch)
    table = exchange(where, "rows per worker and columns", [batch.n] + wire.facts(), wire.signature, group)
    per_source = table[:, 0].tolist()
    if not batch.cols:
        return Batch({}, sum(per_source), batch.device)
    wire.read(table[:, 1:])
    if limit is not None and sum(per_source) * wire.row_bytes > limit:
        return None
    dev = D.device(group)
    flat = torch.cat([wire.rows().reshape(-1).to(dev), wire.dictionaries(dev)])
    sizes = [c * wire.row_bytes + sum(wire.dict_sizes[s]) for s, c in enumerate(per_source)]
    got = D.all_gather(flat, group=group, sizes=sizes)
    return _received(wire, got, per_source, sizes, me, batch.device)


def _received(wire: _Wire, flat: torch.Tensor, per_source: list[int], sizes: list[int], me: int, device) -> Batch:
    """The batch from a payload of ``sizes[r]`` bytes from each worker r: its rows, then (when
    some dictionaries differ) its dictionaries (this worker's own are the ones it holds)."""
    rb = wire.row_bytes
    if not wire.differ:
        return wire.unpack(flat.reshape(sum(per_source), rb).to(device), per_source, [None] * len(sizes), device)
    blocks = torch.split(flat, sizes)
    rows = torch.cat([b[: c * rb] for b, c in zip(blocks, per_source)]).reshape(sum(per_source), rb).to(device)
    dicts = [None if s == me else b[c * rb:].cpu().numpy().tobytes()
             for s, (b, c) in enumerate(zip(blocks, per_source))]
    return wire.unpack(rows, per_source, dicts, device)


def slice_rows(batch: Batch, group=None) -> Batch:
    """This worker's share (row i where i % world == rank) of a batch every worker holds whole."""
    world, me = dist.get_world_size(group), dist.get_rank(group)
    idx = torch.arange(me, batch.n, world, device=batch.device)
    return batch.take(idx)


def batch_bytes(batch: Batch) -> int:
    return sum(c.values.numel() * c.values.element_size() + len(c) for c in batch.cols.values())


__all__ = ["key_bits", "key_dest", "shuffle_rows", "gather_rows", "slice_rows", "batch_bytes"]
