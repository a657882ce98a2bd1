"""Files that appear whole or not at all: written under a temporary name, fsynced, then renamed
(the SQL database and COPY, stream checkpoints).

Why: a process killed while writing (the database's data files and catalog, ``COPY ... TO``) must
never leave a half-written file under the name a reader opens. ``os.replace`` is atomic on POSIX;
the fsyncs order the data before the rename and the rename before what follows it."""
from __future__ import annotations

import os
import uuid
from collections.abc import Callable

TMP_MARK = ".tmp-"


def _syncing() -> bool:
    """``OPFORGE_FSYNC=0`` skips the fsyncs: only for processes whose test kills them (a killed
    process loses nothing the kernel already holds, so the renames alone decide what survives);
    never where the machine itself may fail."""
    return os.environ.get("OPFORGE_FSYNC", "1") != "0"


def fsync_file(path: str) -> None:
    if not _syncing():
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: str) -> None:
    """Makes a rename or unlink in ``path`` durable (a no-op where directories cannot be opened)."""
    if not _syncing():
        return
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def temp_name(path: str) -> str:
    """A sibling name no other writer uses; ``is_temp`` recognizes it."""
    return f"{path}{TMP_MARK}{uuid.uuid4().hex[:12]}"


def is_temp(name: str) -> bool:
    return TMP_MARK in name


def write_aside(path: str, write: Callable[[str], None], sync_dir: bool = True) -> None:
    """``write(tmp)`` writes the file under a temporary name; it is fsynced and renamed to ``path``.
    On any error the temporary file is removed and ``path`` is left as it was."""
    tmp = temp_name(path)
    try:
        write(tmp)
        fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise
    if sync_dir:
        fsync_dir(os.path.dirname(os.path.abspath(path)))
