"""A live placement-driver service for tests: uvicorn in a background thread
on a socket bound to 127.0.0.1:0 (every wait bounded), plus raw-HTTP helpers."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request

import uvicorn

from opforge.placement.client import PDClient
from opforge.placement.driver import Driver
from opforge.placement.service import create_app
from opforge.placement.storage import Storage

TOKEN = "s3cret-test-token"


class Server:
    """uvicorn in a thread, on a socket bound to 127.0.0.1:0."""

    def __init__(self, db=None, tick_interval=0.05, driver=None, token=TOKEN, **app_args):
        self.driver = driver or Driver()
        self.storage = Storage(db) if db else None
        self.app = create_app(self.driver, self.storage, token=token, tick_interval=tick_interval, **app_args)
        self.svc = self.app.state.pd
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}"
        cfg = uvicorn.Config(self.app, log_level="warning", lifespan="on", access_log=False)
        self.server = uvicorn.Server(cfg)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True)

    def __enter__(self):
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            assert self.thread.is_alive(), "the server thread died while starting"
            assert time.monotonic() < deadline, "the server did not start within 10 s"
            time.sleep(0.01)
        return self

    def __exit__(self, *exc):
        self.server.should_exit = True
        self.thread.join(10)
        assert not self.thread.is_alive(), "the server did not stop within 10 s"
        self.sock.close()
        if self.storage is not None:
            self.storage.close()

    def client(self, token=TOKEN):
        return PDClient(self.url, token, timeout=10)


def raw(url, method="GET", body=None, token=TOKEN, raw_body=None, headers=None):
    """(status, decoded JSON body) of one request; ``raw_body`` is sent as is."""
    data = raw_body if raw_body is not None else (None if body is None else json.dumps(body).encode())
    hdrs = {"Content-Type": "application/json", **(headers or {})}
    if token is not None:
        hdrs["Authorization"] = f"Bearer {token}"
    req = urllib.request.Request(url, data=data, method=method, headers=hdrs)
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read() or b"null")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"null")
