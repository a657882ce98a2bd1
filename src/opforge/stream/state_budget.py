"""Keyed columnar state over a memory budget: device, then host memory, then disk.

``env.set_state_budget(device_bytes, host_bytes=None, spill_dir=None)`` (Flink
keeps keyed state in a state backend sized by managed memory; here the state
of the columnar (GPU) operators lives in device tensors). When an operator's
table of keyed state grows past ``device_bytes`` (per subtask), its coldest
rows — the (key, window) rows touched longest ago — move to host memory; when
the host tier grows past ``host_bytes`` it is written to an Arrow IPC file in
``spill_dir`` (never pickle). A row comes back to the device transparently
when a batch touches its (key, window) or a watermark is about to fire or
purge it. Spill files are deleted as soon as they are read back, and all of
them at the end of the job (or when the operator is garbage collected). The
rows of a file read back but not needed stay in host memory while the host
tier fits its budget, else they go back to disk at once.
Checkpoints hold every tier (the table is gathered whole), so a restored job
sees the same state with or without a budget. The columnar joins' buffered
rows obey the same budget (``columnar_join.py`` says which of their rows are
coldest and when they come back).

``ColdRows``: the host and disk tiers of one operator subtask's table. Rows are
dicts of equal-length CPU columns; the disk tier keeps, per file, a zone map
(min / max of two int columns, by default the key and the window start:
``kmin, kmax, smin, smax``; ``zone`` names others, e.g. a join's key and
event time) so a lookup opens only the files that can hold a row it needs.
Tables of one subtask kept apart (a join's two inputs, whose columns differ)
share one host budget through ``share_host_budget``.
"""

from __future__ import annotations

import bisect
import os
import shutil
import tempfile
import weakref
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class StateBudget:
    """Per operator subtask: bytes of keyed columnar state kept on the device,
    bytes kept in host memory beyond that (None: unbounded), and the
    directory spill files go to (None: a fresh temporary directory)."""

    device_bytes: int
    host_bytes: int | None = None
    spill_dir: str | None = None

    def __post_init__(self):
        for name in ("device_bytes", "host_bytes"):
            v = getattr(self, name)
            if v is None and name == "host_bytes":
                continue
            if isinstance(v, bool) or not isinstance(v, int) or v < 0:
                raise ValueError(f"set_state_budget: {name} must be a non-negative int of bytes, got {v!r}")


# A column of rows is a tensor, or a Python list for values that are not numbers (a rolling
# aggregate's first records may carry strings): lists live on the host in every tier.
def rows_bytes(rows: dict) -> int:
    """Bytes of the tensor columns (what a tier's budget counts)."""
    return sum(c.element_size() * c.numel() for c in rows.values() if isinstance(c, torch.Tensor))


def rows_len(rows: dict) -> int:
    return len(next(iter(rows.values()))) if rows else 0


def _cat(a, b):
    if isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor):
        return torch.cat([a, b])
    # a list column meets a tensor one (a file read back typed its values): lists of values
    return (a.tolist() if isinstance(a, torch.Tensor) else list(a)) + (b.tolist() if isinstance(b, torch.Tensor)
                                                                       else list(b))


def cat_rows(a: dict | None, b: dict) -> dict:
    if not a or rows_len(a) == 0:
        return b
    return {n: _cat(a[n], b[n]) for n in a}


def _mask(c, mask: torch.Tensor):
    if isinstance(c, torch.Tensor):
        return c[mask.to(c.device)]
    return [v for v, m in zip(c, mask.tolist()) if m]


def take_rows(rows: dict, mask: torch.Tensor) -> tuple[dict, dict]:
    """(rows where ``mask``, the others), both in row order."""
    return {n: _mask(c, mask) for n, c in rows.items()}, {n: _mask(c, ~mask) for n, c in rows.items()}


def _from_arrow(table) -> dict:
    import pyarrow as pa

    out = {}
    for n in table.column_names:
        col = table.column(n)
        if pa.types.is_integer(col.type) or pa.types.is_floating(col.type) or pa.types.is_boolean(col.type):
            out[n] = torch.from_numpy(col.to_numpy(zero_copy_only=False).copy())
        else:
            out[n] = col.to_pylist()
    return out


def _remove_tree(path: str) -> None:
    shutil.rmtree(path, ignore_errors=True)


class ColdRows:
    """The host and disk tiers of one table (see the module doc)."""

    def __init__(self, budget: StateBudget, name: str, zone: tuple[str, str] = ("key", "start")):
        self.budget = budget
        self.name = "".join(ch if ch.isalnum() or ch in "-_" else "_" for ch in name)
        self.zone = zone  # the int columns whose ranges a file's zone map keeps (kmin/kmax, smin/smax)
        self._peers: list | None = None  # the tables sharing the host budget (None: this one alone)
        self.host: dict | None = None
        self.files: list[dict] = []  # {path, rows, kmin, kmax, smin, smax}
        self._dir = None
        self._seq = 0
        self.spilled_files = 0  # files written over the job (a metric)
        self.evicted_rows = 0
        self.restored_rows = 0
        self._finalizer = None

    # -- sizes ----------------------------------------------------------------
    def __len__(self) -> int:
        return (rows_len(self.host) if self.host else 0) + sum(f["rows"] for f in self.files)

    def host_bytes(self) -> int:
        return rows_bytes(self.host) if self.host else 0

    def share_host_budget(self, *others: "ColdRows") -> None:
        """One host budget for these tables and this one (a subtask's, kept apart)."""
        group = [self, *others]
        for c in group:
            c._peers = group

    # -- adding ----------------------------------------------------------------
    def add(self, rows: dict) -> None:
        """Rows evicted from the device (CPU tensors)."""
        if rows_len(rows) == 0:
            return
        self.evicted_rows += rows_len(rows)
        self.host = cat_rows(self.host, rows)
        self._fit_host_budget()

    def _fit_host_budget(self) -> None:
        """Over the (shared) host budget: the largest host tiers go to disk until it fits."""
        limit = self.budget.host_bytes
        if limit is None:
            return
        peers = self._peers or [self]
        used = sum(p.host_bytes() for p in peers)
        for p in sorted(peers, key=lambda p: p.host_bytes(), reverse=True):
            if used <= limit:
                break
            if p.host and rows_len(p.host):
                used -= p.host_bytes()
                p._spill(p.host)
                p.host = None

    def _directory(self) -> str:
        if self._dir is None:
            if self.budget.spill_dir is not None:
                os.makedirs(self.budget.spill_dir, exist_ok=True)
                self._dir = tempfile.mkdtemp(prefix=f"{self.name}-", dir=self.budget.spill_dir)
            else:
                self._dir = tempfile.mkdtemp(prefix=f"opforge-spill-{self.name}-")
            self._finalizer = weakref.finalize(self, _remove_tree, self._dir)
        return self._dir

    def _spill(self, rows: dict) -> None:
        import pyarrow as pa

        path = os.path.join(self._directory(), f"rows-{self._seq:06d}.arrow")
        self._seq += 1
        table = pa.table({n: pa.array(c.numpy() if isinstance(c, torch.Tensor) else c) for n, c in rows.items()})
        with pa.OSFile(path, "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
            writer.write_table(table)
        k, s = rows[self.zone[0]], rows[self.zone[1]]
        self.files.append({"path": path, "rows": rows_len(rows), "kmin": int(k.min()), "kmax": int(k.max()),
                           "smin": int(s.min()), "smax": int(s.max())})
        self.spilled_files += 1

    def _load(self, f: dict) -> dict:
        import pyarrow as pa

        with pa.memory_map(f["path"], "r") as src:
            table = pa.ipc.open_file(src).read_all()
        rows = _from_arrow(table)
        os.remove(f["path"])
        return rows

    def _load_where(self, might_hold) -> None:
        """Read back into the host tier every file whose zone ``might_hold``."""
        keep = []
        for f in self.files:
            if might_hold(f):
                self.host = cat_rows(self.host, self._load(f))
            else:
                keep.append(f)
        self.files = keep

    # -- taking back ---------------------------------------------------------
    def take(self, mask_of, might_hold) -> dict | None:
        """Remove and return the rows where ``mask_of(rows)`` (files whose
        zone ``might_hold`` such rows are read first); None if none."""
        if len(self) == 0:
            return None
        self._load_where(might_hold)
        if not self.host or rows_len(self.host) == 0:
            return None
        mask = mask_of(self.host)
        if not bool(mask.any()):
            self._fit_host_budget()  # files read back for nothing go back to disk
            return None
        out, self.host = take_rows(self.host, mask)
        self.restored_rows += rows_len(out)
        self._fit_host_budget()  # the rest of the files read back, when over the budget
        return out

    def drop(self, mask_of, all_in, might_hold) -> None:
        """Forget rows where ``mask_of(rows)``: whole files when ``all_in(zone)``,
        else those files are read and filtered."""
        keep = []
        for f in self.files:
            if all_in(f):
                os.remove(f["path"])
            else:
                keep.append(f)
        self.files = keep
        self._load_where(might_hold)
        if self.host and rows_len(self.host):
            _, self.host = take_rows(self.host, mask_of(self.host))
        self._fit_host_budget()

    def take_all(self) -> dict | None:
        """Every cold row (for a checkpoint), leaving the tiers as they were."""
        parts = [self.host] if self.host and rows_len(self.host) else []
        for f in self.files:
            import pyarrow as pa

            with pa.memory_map(f["path"], "r") as src:
                table = pa.ipc.open_file(src).read_all()
            parts.append(_from_arrow(table))
        if not parts:
            return None
        out = parts[0]
        for p in parts[1:]:
            out = cat_rows(out, p)
        return out

    def clear(self) -> None:
        """Forget every cold row and delete the spill files and directory."""
        self.host, self.files = None, []
        if self._dir is not None:
            self._finalizer()
            self._dir = None


def batch_keys(keys: torch.Tensor):
    """A batch's distinct keys on the host (sorted, one read-back), and a zone-map test for
    ``ColdRows.take``: "this file's key range holds one of them"."""
    want = torch.unique(keys.cpu())
    points = want.tolist()

    def might_hold(f):
        i = bisect.bisect_left(points, f["kmin"])
        return i < len(points) and points[i] <= f["kmax"]

    return want, might_hold


def clear_tiers(tiers) -> None:
    """Drop every host row and spill file of these tables (None: no budget)."""
    for c in tiers or ():
        c.clear()
