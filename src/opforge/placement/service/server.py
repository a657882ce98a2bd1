"""``serve``: run the service with uvicorn (``opforge pd serve``)."""

from __future__ import annotations

import ipaddress
import logging
import os

from opforge.placement.service.body_limit import DEFAULT_MAX_BODY_BYTES
from opforge.placement.service.routes import create_app
from opforge.placement.storage import Storage

log = logging.getLogger(__name__)


def _is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def serve(host: str = "127.0.0.1", port: int = 2379, token: str | None = None, db: str | None = None,
          tick_interval: float = 1.0, log_level: str = "info", driver=None,
          max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
    """Run the service with uvicorn until interrupted. ``token`` defaults to
    ``$OPFORGE_PD_TOKEN``; there is no default token (refuses to start
    without one). ``db``: the SQLite file (None: nothing is persisted).
    Request bodies over ``max_body_bytes`` are answered 413."""
    token = token or os.environ.get("OPFORGE_PD_TOKEN")
    if not token:
        raise SystemExit("opforge pd serve: refusing to start without a token; set OPFORGE_PD_TOKEN or pass "
                         "--token-file PATH")
    import uvicorn

    if not _is_loopback(host):
        log.warning("placement driver listening on %s (not loopback): anyone who can reach it and holds the "
                    "token can change the cluster; put TLS in front of it", host)
    if driver is None:
        from opforge.placement.driver import Driver

        driver = Driver()
    storage = Storage(db) if db else None
    if storage is None:
        log.warning("placement driver: no --db given; nothing will be persisted")
    app = create_app(driver, storage, token=token, tick_interval=tick_interval, close_storage=True,
                     max_body_bytes=max_body_bytes)
    if storage is not None and app.state.pd.load_report is not None:
        log.info("placement driver: loaded %s from %s", app.state.pd.load_report.to_json(), db)
    uvicorn.run(app, host=host, port=port, log_level=log_level)
