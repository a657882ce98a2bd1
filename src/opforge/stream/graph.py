"""The job graph: one ``Transformation`` per operator the user wrote, each
with its kind, its parameters and its inputs (an upstream transformation,
the partitioner between them, the key selector of a keyed edge and, for side
outputs, the tag). Both executors read this graph: the micro-batch engine
(``executor.py``) and the record-at-a-time reference (``reference.py``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class OutputTag:
    """Names a side output (``ctx.output(tag, value)``, late window data)."""

    tag_id: str
    type_info: Any = None

    def __post_init__(self):
        if not isinstance(self.tag_id, str) or not self.tag_id:
            raise ValueError("OutputTag: the tag id must be a non-empty str")


@dataclass
class Input:
    upstream: "Transformation"
    partitioner: Any = None  # a Partitioner, or None: forward if parallelisms match, else rebalance
    key: Any = None  # KeySelector on keyed edges
    tag: OutputTag | None = None


@dataclass(eq=False)
class Transformation:
    id: int
    kind: str
    name: str
    parallelism: int
    inputs: list[Input] = field(default_factory=list)
    params: dict = field(default_factory=dict)
    uid: str | None = None  # ``DataStream.uid``: the id its state is stored under in checkpoints

    def __repr__(self) -> str:
        return f"Transformation({self.id}, {self.kind}, {self.name!r}, p={self.parallelism})"
