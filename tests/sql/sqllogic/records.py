"""Parsing DuckDB's dialect of sqllogictest (see SOURCE.md next to the peer files) into records.

A record is one statement or one query; ``loop`` / ``foreach`` blocks are unrolled here, so the
runner only sees flat records. Records the runner cannot apply to opforge (``mode skip``,
``onlyif duckdb``, ``skipif opforge``) are kept with ``skip`` set: they count as not passed."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

_HASH = re.compile(r"^(\d+) values hashing to ([0-9a-f]{32})$")


@dataclass
class Record:
    kind: str  # "statement" | "query"
    sql: str
    line: int
    expect_error: bool = False
    error_text: str = ""  # statement error: the expected message (DuckDB's wording, not checked)
    types: str = ""  # query: one letter per column
    sort: str = "nosort"
    label: str = ""
    results: list[str] = field(default_factory=list)  # query: the expected lines after ----
    has_results: bool = False
    skip: str = ""  # why the record is not run (counted as not passed)

    @property
    def hashed(self) -> tuple[int, str] | None:
        """(value count, md5) when the result is given as 'N values hashing to <md5>'."""
        if len(self.results) == 1:
            m = _HASH.match(self.results[0].strip())
            if m:
                return int(m.group(1)), m.group(2)
        return None


def _blocks(lines: list[str]):
    """(first line number, lines) of each blank-line-separated block, comment lines dropped."""
    block, start = [], 0
    for n, raw in enumerate(lines, 1):
        line = raw.rstrip("\n").rstrip("\r")
        if not line.strip():
            if block:
                yield start, block
                block = []
            continue
        if line.startswith("#") and not block:
            continue
        if not block:
            start = n
        block.append(line)
    if block:
        yield start, block


def _record(start: int, header: list[str], body: list[str]) -> Record:
    kind = header[0]
    if "----" in body:
        i = body.index("----")
        text, after, has_results = body[:i], body[i + 1:], True
    else:
        text, after, has_results = body, [], False
    sql = "\n".join(text)
    if kind == "statement":
        return Record("statement", sql, start, expect_error=header[1] == "error",
                      error_text="\n".join(after))
    sort = header[2] if len(header) > 2 else "nosort"
    label = header[3] if len(header) > 3 else ""
    return Record("query", sql, start, types=header[1] if len(header) > 1 else "", sort=sort, label=label,
                  results=after, has_results=has_results)


def _substitute(records: list, name: str, value: str) -> list:
    out = []
    for r in records:
        if isinstance(r, Record):
            out.append(Record(**{**r.__dict__, "sql": r.sql.replace("{" + name + "}", value),
                                 "results": [x.replace("{" + name + "}", value) for x in r.results]}))
        else:
            out.append(r)
    return out


def parse_file(path: str) -> list[Record]:
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    # a stack of open loops: (values, variable, records so far)
    stack: list[tuple[list[str], str, list[Record]]] = [([], "", [])]
    skipping = False
    for start, block in _blocks(lines):
        header = block[0].split()
        word = header[0]
        if word in ("loop", "foreach"):
            if word == "loop":
                values = [str(i) for i in range(int(header[2]), int(header[3]))]
            else:
                # the values as written: DuckDB's runner keeps a quoted value's quotes ('infinity'::DOUBLE)
                values = header[2:]
            stack.append((values, header[1], []))
            rest = block[1:]
            if rest:  # a record right after the loop header without a blank line
                stack[-1][2].extend(parse_lines_block(start + 1, rest, skipping))
            continue
        if word == "endloop":
            values, name, body = stack.pop()
            for v in values:
                stack[-1][2].extend(_substitute(body, name, v))
            continue
        if word == "mode":
            skipping = header[1] == "skip"
            continue
        if word in ("require", "hash-threshold", "halt", "set", "load", "restart", "reconnect"):
            if len(block) > 1:
                stack[-1][2].extend(parse_lines_block(start + 1, block[1:], skipping))
            continue
        stack[-1][2].extend(parse_lines_block(start, block, skipping))
    return stack[0][2]


def parse_lines_block(start: int, block: list[str], skipping: bool) -> list[Record]:
    """One record block, possibly preceded by onlyif / skipif lines."""
    skip = "mode skip" if skipping else ""
    while block and block[0].split()[0] in ("onlyif", "skipif"):
        cond, system = block[0].split()[:2]
        if (cond == "onlyif" and system != "opforge") or (cond == "skipif" and system == "opforge"):
            skip = skip or f"{cond} {system}"
        block, start = block[1:], start + 1
    if not block:
        return []
    header = block[0].split()
    if header[0] not in ("statement", "query"):
        return []
    rec = _record(start, header, block[1:])
    rec.skip = skip
    return [rec]
