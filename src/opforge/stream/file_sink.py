"""``FileSink``: Parquet, Arrow IPC, CSV or JSON-lines part files with exactly-once
output through two-phase commit (Flink's ``FileSink`` / ``TwoPhaseCommitSinkFunction``).

Each subtask writes the records between two checkpoints to a hidden
in-progress file ``.<prefix>-<subtask>.inprogress``. When a checkpoint is
taken (``snapshot_state``, the *pre-commit*) the file is closed and renamed to
``.<prefix>-<subtask>-<checkpoint>.<ext>.pending``, and its name goes into
the checkpoint. Only when the checkpoint is complete
(``notify_checkpoint_complete``, the *commit*) is it renamed to the visible
``<prefix>-<subtask>-<checkpoint>.<ext>``. After a crash, a restore commits
the pending files its checkpoint names (the crash may have come between the
checkpoint and the commit) and deletes every other in-progress or pending file
of the subtask: output after the checkpoint is discarded and produced again.
Readers see whole checkpoints' output, never a partial file, never twice.

Without checkpointing the open files are committed at the end of the input
(``finish``). Restoring an *older* checkpoint than the latest does not take
back files already committed after it (as in Flink).
"""

from __future__ import annotations

import json
import os
import re

from opforge.stream.checkpoint import _fsync_dir
from opforge.stream.sinks import Sink

EXT = {"parquet": "parquet", "arrow": "arrow", "csv": "csv", "json": "jsonl"}


class _PartWriter:
    """An open in-progress file of one format."""

    def __init__(self, path: str, fmt: str, where: str):
        self.path, self.fmt, self.where = path, fmt, where
        self.schema = None
        self.writer = None
        self.file = None
        self.rows = 0

    def write(self, table) -> None:
        if self.fmt == "json":
            if self.file is None:
                self.file = open(self.path, "w", encoding="utf-8")
            for row in table.to_pylist():
                self.file.write(json.dumps(row, separators=(",", ":")) + "\n")
        else:
            if self.writer is None:
                self.schema = table.schema
                if self.fmt == "parquet":
                    import pyarrow.parquet as pq

                    self.writer = pq.ParquetWriter(self.path, self.schema)
                elif self.fmt == "arrow":
                    import pyarrow.ipc as ipc

                    self.writer = ipc.new_file(self.path, self.schema)
                else:
                    import pyarrow.csv as pcsv

                    self.writer = pcsv.CSVWriter(self.path, self.schema)
            if table.schema != self.schema:
                try:
                    table = table.select(self.schema.names).cast(self.schema)
                except (KeyError, ValueError, TypeError, NotImplementedError) as e:
                    raise ValueError(f"{self.where}: records changed shape within a part file "
                                     f"({table.schema} after {self.schema}): {e}") from None
            self.writer.write_table(table)
        self.rows += table.num_rows

    def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
        if self.file is not None:
            self.file.close()
        with open(self.path, "rb+") as f:
            os.fsync(f.fileno())


class FileSink(Sink):
    def __init__(self, path, format: str = "parquet", prefix: str = "part"):
        if format not in EXT:
            raise ValueError(f"FileSink: format must be one of {list(EXT)}, got {format!r}")
        if not isinstance(prefix, str) or not re.fullmatch(r"[A-Za-z0-9_][A-Za-z0-9_.=]*", prefix):
            raise ValueError(f"FileSink: prefix must be a plain file-name prefix, got {prefix!r}")
        self.path = os.fspath(path)
        self.format = format
        self.prefix = prefix
        self.writers: dict[int, _PartWriter] = {}
        self.pending: dict[int, list] = {}  # subtask -> [[checkpoint, file name], ...]
        self.where = f"FileSink({self.path!r})"

    # -- names ------------------------------------------------------------------
    def _inprogress(self, subtask: int) -> str:
        return os.path.join(self.path, f".{self.prefix}-{subtask}.inprogress")

    def _pending_name(self, subtask: int, checkpoint_id: int) -> str:
        return f".{self.prefix}-{subtask}-{checkpoint_id:08d}.{EXT[self.format]}.pending"

    def _final_name(self, subtask: int, checkpoint_id: int) -> str:
        return f"{self.prefix}-{subtask}-{checkpoint_id:08d}.{EXT[self.format]}"

    # -- the job's life ----------------------------------------------------------
    def open(self, subtask: int, parallelism: int) -> None:
        """A job starts: forget the last job's writers; an in-progress file
        left by a crash holds no committed data."""
        os.makedirs(self.path, exist_ok=True)
        self.writers.pop(subtask, None)
        self.pending[subtask] = []
        try:
            os.remove(self._inprogress(subtask))
        except FileNotFoundError:
            pass

    def write(self, batch, subtask):
        if len(batch) == 0:
            return
        w = self.writers.get(subtask)
        if w is None:
            os.makedirs(self.path, exist_ok=True)
            w = self.writers[subtask] = _PartWriter(self._inprogress(subtask), self.format, self.where)
        w.write(batch.to_arrow())

    def snapshot_state(self, subtask: int, checkpoint_id: int) -> dict:
        """Pre-commit: close the in-progress file as this checkpoint's pending file."""
        w = self.writers.pop(subtask, None)
        pending = self.pending.setdefault(subtask, [])
        if w is not None:
            w.close()
            name = self._pending_name(subtask, checkpoint_id)
            os.replace(w.path, os.path.join(self.path, name))
            _fsync_dir(self.path)
            pending.append([checkpoint_id, name])
        return {"pending": [list(p) for p in pending], "format": self.format, "prefix": self.prefix}

    def notify_checkpoint_complete(self, subtask: int, checkpoint_id: int) -> None:
        """Commit: make the pending files of checkpoints ``<= checkpoint_id`` visible."""
        keep = []
        for cid, name in self.pending.get(subtask, []):
            if cid <= checkpoint_id:
                self._commit(subtask, cid, name)
            else:
                keep.append([cid, name])
        self.pending[subtask] = keep
        _fsync_dir(self.path)

    def _commit(self, subtask: int, cid: int, name: str) -> None:
        src = os.path.join(self.path, name)
        dst = os.path.join(self.path, self._final_name(subtask, cid))
        if os.path.exists(src):
            os.replace(src, dst)
        elif not os.path.exists(dst):
            raise FileNotFoundError(f"{self.where}: pending file {name} of checkpoint {cid} is gone; "
                                    "its output cannot be committed")

    def restore_state(self, subtask: int, state: dict) -> None:
        """The restored checkpoint is complete: commit its pending files, discard the rest."""
        if state.get("format") != self.format:
            raise ValueError(f"{self.where}: the checkpoint's sink wrote {state.get('format')}, "
                             f"this sink writes {self.format}")
        for cid, name in state["pending"]:
            self._commit(subtask, cid, name)
        self.pending[subtask] = []
        mine = re.compile(rf"^\.{re.escape(self.prefix)}-{subtask}(-\d+\.{EXT[self.format]}\.pending|\.inprogress)$")
        for n in os.listdir(self.path):
            if mine.match(n):
                os.remove(os.path.join(self.path, n))
        _fsync_dir(self.path)

    def restore_rescaled(self, subtask: int, states: list) -> None:
        """At another parallelism (``rescale.py``): commit the pending files of the
        old subtasks ``j`` handed to this one (``[(j, state), ...]``) under their
        own names, and discard their uncommitted files."""
        for j, state in states:
            self.restore_state(j, state)
        self.pending[subtask] = []

    def finish(self) -> None:
        """End of input without checkpointing: commit every open file."""
        for subtask in sorted(self.writers):
            w = self.writers.pop(subtask)
            w.close()
            os.replace(w.path, os.path.join(self.path, self._final_name(subtask, 0)))
        if os.path.isdir(self.path):
            _fsync_dir(self.path)

    # -- reading back ------------------------------------------------------------
    def committed_files(self) -> list[str]:
        return committed_files(self.path, self.prefix)


def committed_files(path, prefix: str = "part") -> list[str]:
    """The visible part files under ``path``, in commit order (checkpoint, subtask)."""
    pat = re.compile(rf"^{re.escape(prefix)}-(\d+)-(\d+)\.(parquet|arrow|csv|jsonl)$")
    found = []
    for n in os.listdir(path):
        m = pat.match(n)
        if m:
            found.append((int(m.group(2)), int(m.group(1)), os.path.join(path, n)))
    return [p for _, _, p in sorted(found)]


def read_committed(path, prefix: str = "part"):
    """All committed records under ``path`` as one Arrow table, in commit order."""
    import pyarrow as pa

    from opforge.stream.file_source import FORMATS, read_table

    tables = [read_table(f, FORMATS["." + f.rsplit(".", 1)[1]]) for f in committed_files(path, prefix)]
    if not tables:
        return pa.table({})
    return pa.concat_tables(tables, promote_options="default")
