"""The workloads whose kernel launches make the manifests.

* ``sql``: the 22 TPC-H queries (tables from ``tpchgen-cli``) at each scale given.
* ``stream``: the Nexmark queries of ``opforge.stream.nexmark`` (q0-q5, q7, q8).
* ``ops``: every registered op's ``samples`` through dispatch's choice.

Sizes. Some constexprs follow the data (a block is the next power of two of a
row count, a table's group count picks the private-accumulator width) and so
does an int argument's specialization class (divisible by 16, equal to 1), so a
recording covers the sizes it ran at, nothing more. The shipped manifests are
therefore the union of several recordings (their ``recipes``): on the CPU under
the Triton interpreter at the small sizes CI can afford (TPC-H SF0.001, 10 000
Nexmark events -- the coverage test reruns exactly these), and on the GPU at
the sizes users run (TPC-H SF1 by default, ``--scale 10`` adds SF10; 1 M
Nexmark events in 64 Ki-event batches), where dispatch also picks the configs
tuned for that GPU, which the interpreter run does not see. Recording on the GPU is cheap (the workload's
own run time); on the CPU the interpreter runs each kernel program by program,
so CPU recordings stay small.
"""

from __future__ import annotations

import contextlib
import os
from typing import Callable

# CI's recordings: the coverage test runs these and checks the manifests hold what they launch.
CI_SQL_SCALES = (0.001,)
CI_STREAM_EVENTS = 10_000
CI_STREAM_BATCH = 1000
# The GPU's recordings (see the module docstring).
GPU_SQL_SCALES = (1.0,)
GPU_STREAM_EVENTS = 1_000_000
GPU_STREAM_BATCH = 65_536

NEXMARK_QUERIES = ("q0", "q1", "q2", "q3", "q4", "q5", "q7", "q8")


def sql(device: str, scales=CI_SQL_SCALES, numbers=None, on_step: Callable[[str], None] | None = None) -> list[str]:
    """Run the TPC-H queries at each scale; returns the recipe strings."""
    from opforge import sql as opsql
    from opforge.sql.tpch import data, queries

    recipes = []
    for sf in scales:
        con = opsql.connect(device=device)
        for name, p in data.generate(sf).items():
            con.register(name, str(p))
        for n in numbers or queries.NUMBERS:
            con.sql(queries.query(n)).to_arrow()
            if on_step:
                on_step(f"TPC-H SF{sf:g} {queries.name(n)}")
        recipes.append(f"tpch sf={sf:g} queries={_span(numbers or queries.NUMBERS)} device={device}")
    return recipes


def stream(device: str, events: int = CI_STREAM_EVENTS, batch_size: int = CI_STREAM_BATCH, parallelism: int = 2,
           on_step: Callable[[str], None] | None = None) -> list[str]:
    """Run the Nexmark queries (the tests' event mix: 1000 events/s, 300 ms out of order)."""
    from opforge.stream import StreamExecutionEnvironment
    from opforge.stream import nexmark

    config = nexmark.NexmarkConfig(events=events, events_per_second=1000, max_out_of_orderness_ms=300, seed=5)
    for q in NEXMARK_QUERIES:
        env = StreamExecutionEnvironment(device=device, parallelism=parallelism, batch_size=batch_size)
        getattr(nexmark, q)(env, config).collect()
        env.execute(q)
        if on_step:
            on_step(f"Nexmark {q}")
    return [f"nexmark events={events} batch={batch_size} parallelism={parallelism} queries={','.join(NEXMARK_QUERIES)} "
            f"device={device}"]


def ops(device: str, on_step: Callable[[str], None] | None = None) -> list[str]:
    """Each registered op's samples, through dispatch's choice (a sample an op rejects here is skipped).

    Without tuning (``OPFORGE_AUTOTUNE=off`` for the run): the samples are small
    shapes chosen to reach every variant, and tuning them would add every
    candidate config of every op to the manifest."""
    import torch

    from opforge.runtime import dispatch, registry

    dev = torch.device(device)
    saved = os.environ.get("OPFORGE_AUTOTUNE")
    os.environ["OPFORGE_AUTOTUNE"] = "off"
    try:
        for op in registry.all_ops():
            for args in op.samples(dev):
                with contextlib.suppress(Exception):  # selftest reports failures; here only launches matter
                    dispatch.call(op, *args)
            if on_step:
                on_step(op.qualname)
    finally:
        if saved is None:
            os.environ.pop("OPFORGE_AUTOTUNE", None)
        else:
            os.environ["OPFORGE_AUTOTUNE"] = saved
    return [f"ops samples autotune=off device={device}"]


def _span(numbers) -> str:
    numbers = list(numbers)
    if numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{numbers[0]}-{numbers[-1]}"
    return ",".join(map(str, numbers))
