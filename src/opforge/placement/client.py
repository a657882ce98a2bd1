"""The worker side of the placement driver: a small HTTP/JSON client.

Standard library only (urllib), so a GPU worker can import it without the
service's dependencies. ``PDClient`` speaks the service's API; ``HeartbeatLoop``
sends a worker's heartbeats on a schedule and hands every step the driver
answers with to a ``StepExecutor`` -- the part a real worker implements
(copy a region's data, hand over leadership, ...).

    client = PDClient("http://127.0.0.1:2379", token)
    client.register_store({"store_id": 1, "address": "gpu0", "capacity": 80 << 30, "available": 80 << 30})
    loop = HeartbeatLoop(client, worker.store_heartbeat, worker.region_heartbeats, worker)
    loop.start()
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from typing import Any, Callable, Iterable, Protocol, runtime_checkable

log = logging.getLogger(__name__)

API = "/pd/api/v1"


class PDError(RuntimeError):
    """The service refused a request (``status`` is the HTTP status; 0 when it
    could not be reached)."""

    def __init__(self, status: int, message: str, path: str = ""):
        super().__init__(f"{status}: {message}" if status else message)
        self.status = status
        self.message = message
        self.path = path


class PDClient:
    def __init__(self, base_url: str | None = None, token: str | None = None, timeout: float = 10.0):
        base_url = base_url or os.environ.get("OPFORGE_PD_URL") or "http://127.0.0.1:2379"
        token = token or os.environ.get("OPFORGE_PD_TOKEN")
        if not token:
            raise ValueError("PDClient needs a token (argument or OPFORGE_PD_TOKEN)")
        if "://" not in base_url:
            base_url = "http://" + base_url
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout
        self._headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json",
                         "Accept": "application/json"}

    # -- transport -------------------------------------------------------
    def request(self, method: str, path: str, body: Any = None, params: dict | None = None) -> Any:
        url = f"{self.base_url}{API}/{path.lstrip('/')}"
        if params:
            q = {k: v for k, v in params.items() if v is not None}
            if q:
                url += "?" + urllib.parse.urlencode(q)
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        req = urllib.request.Request(url, data=data, method=method, headers=self._headers)
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as e:
            raw = e.read()
            try:
                msg = json.loads(raw).get("error") or raw.decode(errors="replace")
            except (ValueError, AttributeError):
                msg = raw.decode(errors="replace") or e.reason
            raise PDError(e.code, str(msg), path) from None
        except (urllib.error.URLError, OSError) as e:
            reason = getattr(e, "reason", e)
            raise PDError(0, f"cannot reach the placement driver at {self.base_url}: {reason}", path) from None
        return json.loads(raw) if raw else None

    def get(self, path: str, **params) -> Any:
        return self.request("GET", path, params=params)

    def post(self, path: str, body: Any = None) -> Any:
        return self.request("POST", path, body if body is not None else {})

    def put(self, path: str, body: Any) -> Any:
        return self.request("PUT", path, body)

    def delete(self, path: str) -> Any:
        return self.request("DELETE", path)

    # -- the worker's calls ----------------------------------------------
    def register_store(self, store: dict) -> dict:
        return self.post("stores", store)

    def store_heartbeat(self, hb: dict) -> dict:
        return self.post("heartbeat/store", hb)

    def region_heartbeat(self, hb: dict) -> dict:
        """One region heartbeat; returns {"region_id", "operator_id", "step"}
        (``step`` is None when the leader has nothing to do)."""
        return self.post("heartbeat/region", hb)

    def region_heartbeats(self, hbs: list[dict]) -> dict:
        """A batch; returns {"accepted", "refused", "steps": [responses with a step], "errors"}."""
        return self.post("heartbeat/regions", {"heartbeats": list(hbs)})

    # -- admin calls (pd-ctl) ----------------------------------------------
    def health(self) -> dict:
        return self.get("health")

    def stores(self) -> dict:
        return self.get("stores")

    def store(self, store_id: int) -> dict:
        return self.get(f"stores/{int(store_id)}")

    def set_store_state(self, store_id: int, state: str) -> dict:
        return self.post(f"stores/{int(store_id)}/state", {"state": state})

    def regions(self, offset: int = 0, limit: int = 100, store_id: int | None = None) -> dict:
        return self.get("regions", offset=offset, limit=limit, store_id=store_id)

    def region(self, region_id: int) -> dict:
        return self.get(f"regions/{int(region_id)}")

    def operators(self, history: int = 100) -> dict:
        return self.get("operators", history=history)

    def add_operator(self, kind: str, region_id: int, **args) -> dict:
        return self.post("operators", {"kind": kind, "region_id": region_id, **args})

    def remove_operator(self, region_id: int) -> dict:
        return self.delete(f"operators/{int(region_id)}")

    def schedulers(self) -> dict:
        return self.get("schedulers")

    def add_scheduler(self, name: str, **args) -> dict:
        return self.post("schedulers", {"name": name, "args": args})

    def remove_scheduler(self, name: str) -> dict:
        return self.delete(f"schedulers/{urllib.parse.quote(name, safe='')}")

    def config(self) -> dict:
        return self.get("config")

    def set_config(self, items: dict) -> dict:
        return self.put("config", items)

    def rules(self) -> Any:
        return self.get("rules")

    def set_rules(self, rules: Any) -> Any:
        return self.put("rules", rules)

    def heartbeat_schema(self) -> dict:
        return self.get("schema/heartbeat")


@runtime_checkable
class StepExecutor(Protocol):
    """What a worker does with a step the driver sent for one of its regions.

    ``step`` is the step's JSON (``{"kind": "TransferLeader", "from_store": 1,
    "to_store": 2}``, ...). ``execute`` should start the work and return
    quickly; the driver learns that the step finished from later region
    heartbeats (the region's peers, leader or epoch change), not from a reply,
    so a step received twice must be harmless (it is resent until it shows).
    """

    def execute(self, region_id: int, operator_id: int | None, step: dict) -> None:
        ...


class HeartbeatLoop:
    """Sends one worker's heartbeats and hands the answered steps to an executor.

    ``store_heartbeat()`` returns the store heartbeat dict; ``region_heartbeats()``
    the heartbeats of the regions this worker leads. Region heartbeats go in
    batches of ``batch_size``; a refused heartbeat is logged and counted, not
    fatal; an unreachable driver is retried with backoff.
    """

    def __init__(self, client: PDClient, store_heartbeat: Callable[[], dict],
                 region_heartbeats: Callable[[], Iterable[dict]], executor: StepExecutor,
                 interval: float = 1.0, store_interval: float = 10.0, batch_size: int = 4096):
        self.client = client
        self._store_hb = store_heartbeat
        self._region_hbs = region_heartbeats
        self.executor = executor
        self.interval = interval
        self.store_interval = store_interval
        self.batch_size = batch_size
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._last_store = -float("inf")
        self.rounds = 0
        self.steps_received = 0
        self.refused = 0
        self.failures = 0
        self.last_error = ""

    def run_once(self) -> list[dict]:
        """One round: the store heartbeat (when due), then every region
        heartbeat; returns the responses that carried a step (already executed)."""
        now = time.monotonic()
        if now - self._last_store >= self.store_interval:
            self.client.store_heartbeat(self._store_hb())
            self._last_store = now
        steps: list[dict] = []
        batch: list[dict] = []
        for hb in self._region_hbs():
            batch.append(hb)
            if len(batch) >= self.batch_size:
                steps += self._send(batch)
                batch = []
        if batch:
            steps += self._send(batch)
        for resp in steps:
            try:
                self.executor.execute(resp["region_id"], resp.get("operator_id"), resp["step"])
            except Exception as e:  # an executor failure must not stop the heartbeats
                self.last_error = f"executor: {type(e).__name__}: {e}"
                log.exception("step executor failed on region %s", resp.get("region_id"))
        self.rounds += 1
        self.steps_received += len(steps)
        return steps

    def _send(self, batch: list[dict]) -> list[dict]:
        resp = self.client.region_heartbeats(batch)
        for err in resp.get("errors", ()):
            self.refused += 1
            self.last_error = err.get("error", "")
            log.warning("region heartbeat refused: %s", err.get("error"))
        return [r for r in resp.get("steps", ()) if r.get("step") is not None]

    def start(self) -> None:
        if self._thread is not None:
            return
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, name="pd-heartbeats", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout)
            self._thread = None

    def _run(self) -> None:
        backoff = self.interval
        while not self._stop.is_set():
            try:
                self.run_once()
                backoff = self.interval
            except PDError as e:
                self.failures += 1
                self.last_error = str(e)
                log.warning("heartbeat round failed: %s", e)
                if e.status == 0:  # unreachable: back off up to 30 s
                    backoff = min(max(backoff * 2, self.interval), 30.0)
            if self._stop.wait(backoff):
                break


__all__ = ["PDClient", "PDError", "StepExecutor", "HeartbeatLoop"]
