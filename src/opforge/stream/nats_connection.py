"""A NATS connection for the synchronous engine, and the message formats the
NATS connectors share (a Kafka connector would share them too).

``nats-py`` is asyncio; the executor is not. A ``NatsConnection`` runs its
own event loop on a daemon thread and ``call`` runs a coroutine there and
waits, so the client keeps reading (pings, acks) between the engine's calls.

Formats: ``"json"``: one record per message, a JSON object; ``"arrow"``: one
Arrow IPC stream per message holding a batch of records (what reaches a
million events per second: one message carries many records).
"""

from __future__ import annotations

import asyncio
import json
import threading

FORMATS = ("json", "arrow")
MAX_MESSAGE_BYTES = 512 * 1024  # half the server's default max_payload (1 MiB)


def check_format(fmt: str, where: str) -> str:
    if fmt not in FORMATS:
        raise ValueError(f"{where}: format must be one of {list(FORMATS)}, got {fmt!r}")
    return fmt


class NatsConnection:
    def __init__(self, servers, where: str):
        self.servers = [servers] if isinstance(servers, str) else list(servers)
        self.where = where
        self.last_error: Exception | None = None
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name=f"nats {where}", daemon=True)
        self.thread.start()
        self.nc = self.call(self._connect())
        self.js = self.nc.jetstream()

    async def _connect(self):
        import nats

        async def note(e):  # a failed call raises; this keeps reconnect noise out of the log
            self.last_error = e

        return await nats.connect(servers=self.servers, connect_timeout=5, max_reconnect_attempts=3,
                                  allow_reconnect=True, error_cb=note)

    def call(self, coro, timeout: float | None = 60.0):
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        if not self.loop.is_running():
            return
        try:
            self.call(self.nc.drain(), timeout=10)
        except Exception:  # closing after a failure: nothing left to save
            pass
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


def encode_batch(batch, fmt: str) -> list[bytes]:
    """A micro-batch as message payloads."""
    if fmt == "json":
        return [json.dumps(r, separators=(",", ":")).encode() for r in batch.to_arrow().to_pylist()]
    import pyarrow as pa

    table = batch.to_arrow()
    rows = max(1, table.num_rows * MAX_MESSAGE_BYTES // max(table.nbytes, 1))  # under the server's max_payload
    out = []
    for lo in range(0, table.num_rows, rows):
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as w:
            w.write_table(table.slice(lo, rows))
        out.append(sink.getvalue().to_pybytes())
    return out


def decode_payloads(payloads: list[bytes], fmt: str):
    """Message payloads as records (``json``) or one Arrow table (``arrow``)."""
    if fmt == "json":
        return [json.loads(p) for p in payloads]
    import pyarrow as pa

    tables = [pa.ipc.open_stream(p).read_all() for p in payloads]
    return pa.concat_tables(tables, promote_options="default")
