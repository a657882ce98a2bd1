"""``NatsSource``: records from a NATS JetStream stream, replayable from a checkpoint.

The stream's ``subjects`` are its partitions (as a Kafka topic's): subtask
``i`` of ``p`` reads subjects ``i, i+p, ...``, each through an ephemeral pull
consumer filtered to it that starts at a stream sequence. The split's position
is ``{subject: next stream sequence}``; it goes into checkpoints, and a restored
job makes its consumers start there again, so records after the checkpoint are
read again and none before it. Positions are per subject, so a restored job
may read with another parallelism (``rescale_positions``: subjects dealt anew).

``bounded=True`` reads the messages a subject holds when its consumer starts
and then ends the split (a batch job over a stream, and the tests); otherwise
the split stays open and an empty poll means "nothing now" (idle).
A record is a JSON message (``format="json"``) or an Arrow IPC stream of many
records (``"arrow"``, one message per poll: it is a micro-batch already); see
``nats_connection.py``.
"""

from __future__ import annotations

from opforge.stream.nats_connection import NatsConnection, check_format, decode_payloads
from opforge.stream.sources import Source, SourceSplit


class NatsSource(Source):
    def __init__(self, servers, stream: str, subjects, format: str = "json", bounded: bool = True,
                 fetch_timeout_s: float = 0.05):
        subjects = [subjects] if isinstance(subjects, str) else list(subjects)
        if not subjects or not all(isinstance(s, str) and s for s in subjects):
            raise ValueError("NatsSource: subjects must be one or more subject names")
        if len(set(subjects)) != len(subjects):
            raise ValueError(f"NatsSource: subjects repeat: {subjects}")
        self.servers, self.stream, self.subjects = servers, stream, subjects
        self.format = check_format(format, "NatsSource")
        self.bounded, self.fetch_timeout_s = bounded, fetch_timeout_s
        self.where = f"NatsSource({stream!r})"

    def splits(self, parallelism, batch_size, device):
        return [NatsSplit(self, self.subjects[i::parallelism], batch_size) for i in range(parallelism)]

    def rescale_positions(self, positions: list[dict], parallelism: int) -> list[dict]:
        """Per-subtask positions at another parallelism (``rescale.py``)."""
        merged = {s: seq for p in positions for s, seq in p.items()}
        return [{s: merged.get(s, 1) for s in self.subjects[i::parallelism]} for i in range(parallelism)]


class NatsSplit(SourceSplit):
    """One subtask's subjects, read in turn, one fetch per poll."""

    def __init__(self, source: NatsSource, subjects: list[str], batch_size: int):
        self.source, self.subjects, self.batch_size = source, subjects, batch_size
        self.next_seq = {s: 1 for s in subjects}
        self.subs: dict = {}
        self.remaining: dict = {}  # bounded: messages left to read per subject
        self.turn = 0
        self.conn: NatsConnection | None = None

    def position(self):
        return dict(self.next_seq)

    def seek(self, position) -> None:
        self._drop_consumers()
        self.next_seq = {s: int(position.get(s, 1)) for s in self.subjects}

    def _open(self, subject: str):
        from nats.js import api

        if self.conn is None:
            self.conn = NatsConnection(self.source.servers, self.source.where)
        cfg = api.ConsumerConfig(deliver_policy=api.DeliverPolicy.BY_START_SEQUENCE,
                                 opt_start_seq=self.next_seq[subject], ack_policy=api.AckPolicy.NONE,
                                 inactive_threshold=30.0, mem_storage=True, num_replicas=1)
        js = self.conn.js
        sub = self.conn.call(js.pull_subscribe(subject, stream=self.source.stream, config=cfg))
        self.subs[subject] = sub
        if self.source.bounded:
            self.remaining[subject] = self.conn.call(sub.consumer_info()).num_pending

    def _drop_consumers(self) -> None:
        for sub in self.subs.values():
            try:
                self.conn.call(sub.unsubscribe(), timeout=5)
            except Exception:  # the consumer is ephemeral: the server drops it when idle anyway
                pass
        self.subs, self.remaining = {}, {}

    def __next__(self):
        import nats.errors

        live = [s for s in self.subjects if not (self.source.bounded and self.remaining.get(s) == 0)]
        if not live:
            self.close()
            raise StopIteration
        subject = live[self.turn % len(live)]
        self.turn += 1
        if subject not in self.subs:
            self._open(subject)
            if self.remaining.get(subject) == 0:
                return []
        want = self.batch_size if self.source.format == "json" else 1  # an Arrow message is a micro-batch
        if self.source.bounded:
            want = min(want, self.remaining[subject])
        try:
            msgs = self.conn.call(self.subs[subject].fetch(want, timeout=self.source.fetch_timeout_s))
        except nats.errors.TimeoutError:
            return []
        if not msgs:
            return []
        self.next_seq[subject] = msgs[-1].metadata.sequence.stream + 1
        if self.source.bounded:
            self.remaining[subject] -= len(msgs)
        return decode_payloads([m.data for m in msgs], self.source.format)

    def close(self) -> None:
        if self.conn is not None:
            self._drop_consumers()
            self.conn.close()
            self.conn = None
