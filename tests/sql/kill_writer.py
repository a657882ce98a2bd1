"""The writer side of the kill test (``test_sql_kill.py``).

``python kill_writer.py sql|storage`` is a launcher: it imports what the writer needs once, warms
the write path up, then for each ``run <folder> <seed> <step>`` line on stdin forks a child that
reopens the database in ``folder`` and runs the workload from step ``step`` on, and answers the
child's pid; ``reap <pid>`` waits for it (the test SIGKILLs it first). Why fork: spawning Python
and importing opforge costs seconds, a fork far less. Each trial continues the database the
previous kill left, so the kills land all along the workload and every trial also reopens a
killed database. The child appends each finished step's number to ``folder/log`` (one ``write``,
no buffering), so the test knows which commits returned.

Two writers run the same steps: ``sql`` through ``opforge.sql.connect`` (INSERT, CREATE OR
REPLACE TABLE AS, DELETE, COPY TO statements), and ``storage`` through ``Database.commit`` and
``data_files.write`` directly, in a process without torch, whose fork costs milliseconds: it
takes the many trials. ``expected_states`` is the model: plain Python, the state the database
and the COPY file must hold after each step."""
from __future__ import annotations

import os
import random
import sys

STEPS = 3000
ROWS = 3
ROW_GROUP_ROWS = 8


def step(seed: int, k: int) -> tuple[str, object]:
    """Step ``k``: ("create", None), ("insert", rows), ("ctas", (table, bound)): the rows of t
    with i > bound, ("delete", bound): the rows with i < bound, or ("copy", None): t to out.parquet."""
    if k == 0:
        return "create", None
    kind = k % 6
    if kind in (1, 2, 4):
        rng = random.Random(seed * 100003 + k)
        return "insert", [(rng.randrange(-50, 50), f"s{rng.randrange(10)}'q",
                           None if rng.random() < 0.2 else rng.randrange(100) / 4) for _ in range(ROWS)]
    if kind == 3:
        return "ctas", (f"c{k % 2}", k % 7 - 3)
    if kind == 5 and k % 4 == 1:
        return "delete", k % 9 - 45
    return "copy", None


def expected_states(seed: int, steps: int) -> list[dict]:
    """State after each step: {"t": rows, "c0": rows, "c1": rows, "out": rows} (a name absent: no
    such table / no file)."""
    state: dict = {}
    out = []
    for k in range(steps):
        op, arg = step(seed, k)
        state = dict(state)
        if op == "create":
            state["t"] = []
        elif op == "insert":
            state["t"] = state["t"] + arg
        elif op == "ctas":
            state[arg[0]] = [r for r in state["t"] if r[0] > arg[1]]
        elif op == "delete":
            state["t"] = [r for r in state["t"] if not r[0] < arg]
        else:
            state["out"] = list(state["t"])
        out.append(state)
    return out


def statement(seed: int, k: int, folder: str) -> str:
    op, arg = step(seed, k)
    if op == "create":
        return "CREATE TABLE t(i INTEGER, s VARCHAR, f DOUBLE)"
    if op == "insert":
        return "INSERT INTO t VALUES " + ", ".join(
            f"({i}, '{s.replace(chr(39), chr(39) * 2)}', {'NULL' if f is None else f})" for i, s, f in arg)
    if op == "ctas":
        return f"CREATE OR REPLACE TABLE {arg[0]} AS SELECT i, s, f FROM t WHERE i > {arg[1]}"
    if op == "delete":
        return f"DELETE FROM t WHERE i < {arg}"
    return f"COPY t TO '{os.path.join(folder, 'out.parquet')}' (FORMAT parquet)"


def sql_workload(folder: str, seed: int, start: int = 0, steps: int = STEPS) -> None:
    import opforge.sql as sql

    con = sql.connect(device="cpu", database=os.path.join(folder, "db"))
    log = os.open(os.path.join(folder, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for k in range(start, steps):
        con.sql(statement(seed, k, folder)).fetchall()
        os.write(log, f"{k}\n".encode())


def storage_workload(folder: str, seed: int, start: int = 0, steps: int = STEPS) -> None:
    import pyarrow as pa
    import pyarrow.compute as pc

    from opforge.sql import data_files
    from opforge.sql.database import Change, Database

    schema = pa.schema([("i", pa.int32()), ("s", pa.string()), ("f", pa.float64())])
    db = Database(os.path.join(folder, "db"))
    t = db.load("t") if "t" in db.tables else None
    log = os.open(os.path.join(folder, "log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    for k in range(start, steps):
        op, arg = step(seed, k)
        if op == "create":
            t = schema.empty_table()
            db.commit({"t": Change(t)})
        elif op == "insert":
            new = pa.Table.from_pylist([dict(zip(schema.names, r)) for r in arg], schema)
            t = pa.concat_tables([t, new])
            db.commit({"t": Change(t, appended=new)})
        elif op == "ctas":
            db.commit({arg[0]: Change(t.filter(pc.greater(t["i"], arg[1])))})
        elif op == "delete":
            t = t.filter(pc.invert(pc.less(t["i"], arg)))
            db.commit({"t": Change(t)})
        else:
            data_files.write(t, os.path.join(folder, "out.parquet"), "parquet", {})
        os.write(log, f"{k}\n".encode())


def main() -> None:
    import tempfile

    from opforge.sql import parquet_write

    # files of several row groups: the kills also land while parts are encoded and assembled
    parquet_write.ROW_GROUP_ROWS = ROW_GROUP_ROWS
    workload = sql_workload if sys.argv[1] == "sql" else storage_workload
    if sys.argv[1] == "sql":
        import torch
        torch.set_num_threads(1)  # no OpenMP pool in the parent: a forked child must not inherit one
    with tempfile.TemporaryDirectory() as warm:  # every step kind, and a reopen, before any fork
        workload(warm, 0, 0, 12)
        workload(warm, 0, 12, 14)
    print("ready", flush=True)
    for line in sys.stdin:
        cmd, *args = line.split()
        if cmd == "run":
            pid = os.fork()
            if pid == 0:
                code = 0
                try:
                    workload(args[0], int(args[1]), int(args[2]))
                except BaseException as e:  # reported through the exit status
                    print(f"writer failed: {e!r}", file=sys.stderr, flush=True)
                    code = 1
                os._exit(code)
            print(pid, flush=True)
        elif cmd == "reap":
            _, status = os.waitpid(int(args[0]), 0)
            print(status, flush=True)
        else:
            return


if __name__ == "__main__":
    main()
