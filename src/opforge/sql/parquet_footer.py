"""Parquet footers (Thrift compact protocol): read, written back byte for byte, and merged, so that
row groups encoded as separate in-memory files become one file.

Why: pyarrow encodes one file's row groups on one thread. ``parquet_write`` encodes each row
group as a small file of its own on a thread pool and concatenates their bodies; the offsets that
the footer holds (row group, column chunk, data / dictionary / index page, bloom filter) are then
shifted by where each body landed, and the row groups are listed under one footer, as parquet-mr's
``appendRowGroups`` does. Pages and bloom filters hold no absolute offsets, so the bodies are
copied unchanged. The merge refuses what it cannot move: page indexes (their page locations are
file offsets), encryption, chunks in other files.

The codec is generic (Thrift's compact protocol, any struct): a struct is a ``dict`` of field id ->
``(type, value)`` kept in the order read, lists and sets ``TList``, maps ``TMap``."""
from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import BinaryIO

from opforge.sql.errors import SqlError

# compact protocol types
STOP, TRUE, FALSE, BYTE, I16, I32, I64, DOUBLE, BINARY, LIST, SET, MAP, STRUCT = range(13)

MAGIC = b"PAR1"

# parquet.thrift field ids
FILE_NUM_ROWS, FILE_SCHEMA, FILE_ROW_GROUPS = 3, 2, 4
GROUP_COLUMNS, GROUP_FILE_OFFSET, GROUP_ORDINAL = 1, 5, 7
CHUNK_FILE_PATH, CHUNK_FILE_OFFSET, CHUNK_META = 1, 2, 3
CHUNK_UNSHIFTED = {4: "offset index", 6: "column index", 8: "encryption", 9: "encrypted metadata"}
META_OFFSETS = (9, 10, 11, 14)  # data, index and dictionary page offsets, bloom filter (no offsets inside)


@dataclass
class TList:
    elem: int
    items: list


@dataclass
class TMap:
    key: int
    value: int
    items: list


class _Reader:
    def __init__(self, data: bytes):
        self.data, self.at = data, 0

    def byte(self) -> int:
        b = self.data[self.at]
        self.at += 1
        return b

    def varint(self) -> int:
        shift = result = 0
        while True:
            b = self.byte()
            result |= (b & 0x7F) << shift
            if b < 0x80:
                return result
            shift += 7

    def zigzag(self) -> int:
        n = self.varint()
        return (n >> 1) ^ -(n & 1)

    def value(self, t: int):
        if t in (TRUE, FALSE):  # a bool inside a container: one byte
            return self.byte() == TRUE
        if t == BYTE:
            b = self.byte()
            return b - 256 if b > 127 else b
        if t in (I16, I32, I64):
            return self.zigzag()
        if t == DOUBLE:
            self.at += 8
            return struct.unpack_from("<d", self.data, self.at - 8)[0]
        if t == BINARY:
            n = self.varint()
            self.at += n
            return bytes(self.data[self.at - n:self.at])
        if t in (LIST, SET):
            head = self.byte()
            size, elem = head >> 4, head & 0x0F
            if size == 15:
                size = self.varint()
            return TList(elem, [self.value(elem) for _ in range(size)])
        if t == MAP:
            size = self.varint()
            if not size:
                return TMap(0, 0, [])
            kinds = self.byte()
            k, v = kinds >> 4, kinds & 0x0F
            return TMap(k, v, [(self.value(k), self.value(v)) for _ in range(size)])
        if t == STRUCT:
            return self.struct()
        raise SqlError(f"Parquet footer: unknown Thrift compact type {t} at byte {self.at}")

    def struct(self) -> dict:
        fields, last = {}, 0
        while True:
            head = self.byte()
            if head == STOP:
                return fields
            t, delta = head & 0x0F, head >> 4
            fid = last + delta if delta else self.zigzag()
            fields[fid] = (t, t == TRUE) if t in (TRUE, FALSE) else (t, self.value(t))
            last = fid


class _Writer:
    def __init__(self):
        self.out = bytearray()

    def varint(self, n: int) -> None:
        while n > 0x7F:
            self.out.append((n & 0x7F) | 0x80)
            n >>= 7
        self.out.append(n)

    def zigzag(self, n: int) -> None:
        self.varint((n << 1) ^ (n >> 63))

    def value(self, t: int, v) -> None:
        if t in (TRUE, FALSE):
            self.out.append(TRUE if v else FALSE)
        elif t == BYTE:
            self.out.append(v & 0xFF)
        elif t in (I16, I32, I64):
            self.zigzag(v)
        elif t == DOUBLE:
            self.out += struct.pack("<d", v)
        elif t == BINARY:
            self.varint(len(v))
            self.out += v
        elif t in (LIST, SET):
            n = len(v.items)
            if n < 15:
                self.out.append(n << 4 | v.elem)
            else:
                self.out.append(0xF0 | v.elem)
                self.varint(n)
            for item in v.items:
                self.value(v.elem, item)
        elif t == MAP:
            self.varint(len(v.items))
            if v.items:
                self.out.append(v.key << 4 | v.value)
                for k, x in v.items:
                    self.value(v.key, k)
                    self.value(v.value, x)
        elif t == STRUCT:
            self.struct(v)
        else:
            raise SqlError(f"Parquet footer: unknown Thrift compact type {t}")

    def struct(self, fields: dict) -> None:
        last = 0
        for fid, (t, v) in fields.items():
            if t in (TRUE, FALSE):
                t = TRUE if v else FALSE
            if 0 < fid - last <= 15:
                self.out.append((fid - last) << 4 | t)
            else:
                self.out.append(t)
                self.zigzag(fid)
            if t not in (TRUE, FALSE):
                self.value(t, v)
            last = fid
        self.out.append(STOP)


def decode(data: bytes) -> dict:
    """A Thrift struct (compact protocol) as field id -> (type, value)."""
    reader = _Reader(data)
    fields = reader.struct()
    if reader.at != len(data):
        raise SqlError(f"Parquet footer: {len(data) - reader.at} bytes after the file metadata")
    return fields


def encode(fields: dict) -> bytes:
    writer = _Writer()
    writer.struct(fields)
    return bytes(writer.out)


def split(file: memoryview) -> tuple[memoryview, bytes]:
    """A whole Parquet file's body (its pages, after the leading magic) and its footer's bytes."""
    if len(file) < 12 or bytes(file[:4]) != MAGIC or bytes(file[-4:]) != MAGIC:
        raise SqlError("Parquet part: not a Parquet file (no PAR1 magic)")
    size = int.from_bytes(file[-8:-4], "little")
    end = len(file) - 8 - size
    if end < 4:
        raise SqlError("Parquet part: footer length past the file's start")
    return file[4:end], bytes(file[end:-8])


def _shift(fields: dict, fid: int, by: int) -> None:
    """Moves the offset ``fid`` by ``by``; 0 (no offset can be: the magic is there) means unset, as
    pyarrow leaves the deprecated column chunk ``file_offset``, and stays."""
    if fid in fields and fields[fid][1]:
        t, v = fields[fid]
        fields[fid] = (t, v + by)


def _refuse(fields: dict, names: dict[int, str]) -> None:
    for fid, what in names.items():
        if fid in fields:
            raise SqlError(f"Parquet merge: a part holds a {what}, whose offsets the merge does not move")


def merge(footers: list[tuple[bytes, int]]) -> bytes:
    """One footer for the parts whose footers and body offsets ``footers`` gives ((footer, where
    the part's body starts in the merged file less 4): the amount its offsets move), in order."""
    docs = [decode(f) for f, _ in footers]
    first = docs[0]
    groups, rows = [], 0
    for doc, (_, by) in zip(docs, footers):
        if encode({FILE_SCHEMA: doc[FILE_SCHEMA]}) != encode({FILE_SCHEMA: first[FILE_SCHEMA]}):
            raise SqlError("Parquet merge: the parts' schemas differ")
        rows += doc[FILE_NUM_ROWS][1]
        for group in doc[FILE_ROW_GROUPS][1].items if FILE_ROW_GROUPS in doc else []:
            _shift(group, GROUP_FILE_OFFSET, by)
            if GROUP_ORDINAL in group:
                group[GROUP_ORDINAL] = (I16, len(groups))
            for chunk in group[GROUP_COLUMNS][1].items:
                _refuse(chunk, CHUNK_UNSHIFTED | {CHUNK_FILE_PATH: "path to another file"})
                _shift(chunk, CHUNK_FILE_OFFSET, by)
                meta = chunk[CHUNK_META][1]
                for fid in META_OFFSETS:
                    _shift(meta, fid, by)
            groups.append(group)
    out = dict(first)
    out[FILE_NUM_ROWS] = (I64, rows)
    out[FILE_ROW_GROUPS] = (LIST, TList(STRUCT, groups))
    return encode(dict(sorted(out.items())))


def concatenate(parts: Iterable, out: BinaryIO) -> None:
    """Writes the whole Parquet files ``parts`` (bytes-like, one schema), in order, to ``out`` as
    one file: their bodies unchanged, one after another, under their merged footer."""
    out.write(MAGIC)
    footers, at = [], len(MAGIC)
    for part in parts:
        body, footer = split(memoryview(part))
        out.write(body)
        footers.append((footer, at - len(MAGIC)))
        at += len(body)
    if not footers:
        raise SqlError("Parquet merge: no parts")
    footer = merge(footers)
    out.write(footer)
    out.write(len(footer).to_bytes(4, "little"))
    out.write(MAGIC)
