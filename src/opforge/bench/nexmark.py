"""Bench cases for the Nexmark event generator (``opforge.nexmark_events``): a micro-batch of bids,
as the stream front-end's Nexmark source makes one for every 8 Mi events of q0-q8 on the device.

Bytes are the fewest the op must move: the int64 event index read once, and each of the kind's
columns plus the timestamps written once (8 bytes each). FLOPs: 0 (hashing is integer work).

Peers: torch eager, the reference (about 25 elementwise kernels on int64 columns: the salted hashes
as one ``[salts, n]`` tensor in place, then the fields), and torch.compile of it (Inductor fuses
the elementwise chain too).
"""

from __future__ import annotations

import torch

from opforge.bench.case import BenchCase, compiled_peer
from opforge.ops import nexmark as N

PARAMS = (0, 10_000, 500, 100, 500)  # seed, events/s, skew (ms), auctions in flight, hot bids per mille


def events_case(kind: str, n: int) -> BenchCase:
    """``n`` consecutive events of ``kind`` from index 2^20 on, with the stream benchmark's settings."""
    def make(dev):
        return (torch.arange(1 << 20, (1 << 20) + n, dtype=torch.int64, device=dev),)

    def run(j):
        return N.nexmark_events(j, kind, *PARAMS)

    def reference(j):
        return N.REFERENCE["nexmark_events"](j, kind, *PARAMS)

    return BenchCase(
        op="nexmark_events", label=f"{kind} {n}", dtype=torch.int64, make_args=make, run=run, reference=reference,
        flops=0, nbytes=n * 8 * (1 + len(N.FIELDS[kind]) + 1),
        peers={"torch eager": reference, "torch.compile": compiled_peer(reference)},
        op_args=lambda j: (j, kind, *PARAMS), upcast_reference=False,
    )


def cases(device: torch.device, quick: bool) -> list[BenchCase]:
    """A batch of 8 Mi bids (the stream benchmark's batch), of 1 Mi, and 1 Mi auctions and persons."""
    if quick or device.type != "cuda":
        return [events_case("bid", 5000), events_case("auction", 3000)]
    return [events_case("bid", 8 << 20), events_case("bid", 1 << 20), events_case("auction", 1 << 20),
            events_case("person", 1 << 20)]
