"""``NatsSink``: exactly-once output to a NATS JetStream subject, by two-phase
commit with the checkpoint (as ``FileSink``) and JetStream de-duplication.

Each subtask keeps the messages written since the last checkpoint. At a
checkpoint (``snapshot_state``, the pre-commit) they become that checkpoint's
pending messages and go into the checkpoint itself (payloads as a byte
tensor, Arrow IPC on disk). When the checkpoint is complete
(``notify_checkpoint_complete``, the commit) they are published, each with
the message id ``<id_prefix>:<subtask>:<checkpoint>:<n>`` in ``Nats-Msg-Id``.
After a crash, the restore publishes the restored checkpoint's pending
messages again under the same ids: JetStream drops the ones already stored
(the crash came mid-commit) and stores the rest. Output after the checkpoint
is produced again by the replay and published under new checkpoints' ids.
So the subject holds each record exactly once, provided the stream's
``duplicate_window`` (2 minutes by default) outlasts a restart.
"""

from __future__ import annotations

import torch

from opforge.stream.nats_connection import NatsConnection, check_format, encode_batch
from opforge.stream.sinks import Sink

MSG_ID = "Nats-Msg-Id"


def _pack(payloads: list[bytes]) -> dict:
    """Payloads as two tensors (bytes and offsets): binary in the checkpoint, no base64."""
    offsets = [0]
    for p in payloads:
        offsets.append(offsets[-1] + len(p))
    data = torch.frombuffer(bytearray(b"".join(payloads)), dtype=torch.uint8) if offsets[-1] \
        else torch.empty(0, dtype=torch.uint8)
    return {"data": data, "offsets": torch.tensor(offsets, dtype=torch.int64)}


def _unpack(packed: dict) -> list[bytes]:
    raw = packed["data"].cpu().numpy().tobytes()
    o = packed["offsets"].tolist()
    return [raw[a:b] for a, b in zip(o, o[1:])]


class NatsSink(Sink):
    def __init__(self, servers, subject: str, format: str = "json", id_prefix: str | None = None):
        if not isinstance(subject, str) or not subject:
            raise ValueError("NatsSink: subject must be a subject name")
        self.servers, self.subject = servers, subject
        self.format = check_format(format, "NatsSink")
        self.id_prefix = id_prefix or subject
        self.where = f"NatsSink({subject!r})"
        self.conn: NatsConnection | None = None
        self.open_msgs: dict[int, list[bytes]] = {}  # subtask -> written since the last checkpoint
        self.pending: dict[int, list] = {}  # subtask -> [[checkpoint, payloads], ...]
        self.published = 0

    def _connection(self) -> NatsConnection:
        if self.conn is None:
            self.conn = NatsConnection(self.servers, self.where)
        return self.conn

    def open(self, subtask: int, parallelism: int) -> None:
        self.open_msgs[subtask], self.pending[subtask] = [], []

    def write(self, batch, subtask):
        if len(batch):
            self.open_msgs.setdefault(subtask, []).extend(encode_batch(batch, self.format))

    # -- two-phase commit -------------------------------------------------------
    def snapshot_state(self, subtask: int, checkpoint_id: int) -> dict:
        msgs = self.open_msgs.pop(subtask, [])
        pending = self.pending.setdefault(subtask, [])
        if msgs:
            pending.append([checkpoint_id, msgs])
        return {"subject": self.subject, "id_prefix": self.id_prefix,
                "pending": [[cid, _pack(m)] for cid, m in pending]}

    def notify_checkpoint_complete(self, subtask: int, checkpoint_id: int) -> None:
        keep = []
        for cid, msgs in self.pending.get(subtask, []):
            if cid <= checkpoint_id:
                self._publish(subtask, cid, msgs)
            else:
                keep.append([cid, msgs])
        self.pending[subtask] = keep

    def restore_state(self, subtask: int, state: dict) -> None:
        """The restored checkpoint is complete: publish its pending messages (again)."""
        if state.get("subject") != self.subject:
            raise ValueError(f"{self.where}: the checkpoint's sink wrote to {state.get('subject')!r}")
        for cid, packed in state["pending"]:
            self._publish(subtask, cid, _unpack(packed), state.get("id_prefix", self.id_prefix))
        self.pending[subtask] = []

    def restore_rescaled(self, subtask: int, states: list) -> None:
        """At another parallelism: the old subtasks' pending messages, under their own ids."""
        for j, state in states:
            self.restore_state(j, state)
        self.pending[subtask] = []

    def finish(self) -> None:
        """End of input without checkpointing: publish what is open (checkpoint 0)."""
        for subtask in sorted(self.open_msgs):
            self._publish(subtask, 0, self.open_msgs.pop(subtask))
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def _publish(self, subtask: int, cid: int, msgs: list[bytes], prefix: str | None = None) -> None:
        if not msgs:
            return
        conn = self._connection()
        prefix = prefix or self.id_prefix
        self.published += conn.call(self._publish_all(conn.js, [(f"{prefix}:{subtask}:{cid}:{n}", m)
                                                                for n, m in enumerate(msgs)]))

    async def _publish_all(self, js, msgs: list) -> int:
        """Publish with ids, many in flight; every ack is awaited (stored or a duplicate)."""
        import asyncio

        futures = [await js.publish_async(self.subject, m, headers={MSG_ID: mid}) for mid, m in msgs]
        acks = await asyncio.gather(*futures)
        return sum(1 for a in acks if not a.duplicate)
