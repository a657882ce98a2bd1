"""The placement-driver service a cluster runs in-process: uvicorn in a thread on a loopback port.

The workers reach it over HTTP through ``placement/client.py`` like any store would. Ticks are
run by the coordinator (``tick_interval=0``) after each heartbeat round, so a round's steps follow
from the heartbeats just sent. Stores are marked offline by the coordinator when their worker
dies, so the down timer is long (a worker between queries sends no heartbeats).
"""
from __future__ import annotations

import secrets
import socket
import threading
import time

from opforge.placement.checkers.merge_checker import MergeChecker
from opforge.placement.checkers.split_checker import SplitChecker
from opforge.placement.config import ScheduleConfig
from opforge.placement.driver import Driver

SCHEDULERS = ("balance-leader", "balance-region")
STORE_DOWN_S = 24 * 3600.0
STORE_LIMIT_PER_MIN = 6000.0


def make_driver(replicas: int, hot_bytes: float | None = None) -> Driver:
    """A driver for table regions: ``replicas`` copies, balance schedulers, no merging (the
    regions of a table are its hash partitions; a merge would change the partitioning) and no
    splitting by size. ``hot_bytes``: bytes read per second from which a region is hot: the split
    checker splits one that far outreads the others (its load rule) and the hot-region scheduler
    spreads the hot regions' leaders; None: neither (the default: a split table no longer joins
    co-located with the tables partitioned like it, so splitting is asked for, not assumed)."""
    driver = Driver(ScheduleConfig(**config_overrides()), schedulers=SCHEDULERS)
    driver.set_config("max_replicas", replicas)
    without_merging(driver)
    watch_hot(driver, hot_bytes)
    return driver


def check_hot_bytes(hot_bytes) -> None:
    if hot_bytes is not None and (isinstance(hot_bytes, bool) or not isinstance(hot_bytes, (int, float))
                                  or not 0 < hot_bytes < NEVER):
        raise ValueError(f"opforge.cluster: hot_bytes must be a number of bytes per second in (0, {NEVER:.0e}) "
                         f"or None, got {hot_bytes!r}")


def watch_hot(driver: Driver, hot_bytes: float | None) -> None:
    """Split and spread regions read at ``hot_bytes`` per second or more (None: stop doing so)."""
    check_hot_bytes(hot_bytes)
    load = SplitChecker(min_load_bytes=NEVER if hot_bytes is None else int(hot_bytes), min_load_queries=NEVER)
    driver.checkers = [load if isinstance(c, SplitChecker) else c for c in driver.checkers]
    for key, value in (("hot_region_bytes_threshold", NEVER if hot_bytes is None else hot_bytes),
                       ("hot_region_keys_threshold", NEVER), ("hot_region_query_threshold", NEVER)):
        driver.set_config(key, value)
    if hot_bytes is None and "hot-region" in driver.schedulers:
        driver.remove_scheduler("hot-region")
    elif hot_bytes is not None and "hot-region" not in driver.schedulers:
        driver.add_scheduler("hot-region", kinds=("read-leader",))


NEVER = 10 ** 15  # a threshold no test or benchmark reaches


def config_overrides() -> dict:
    """The ScheduleConfig a cluster's driver runs with (the scale-out prediction simulates the same)."""
    # Table regions are small and a lost worker's replicas should come back within seconds: the
    # per-store snapshot limits are far above PD's defaults (15 a minute). A region is a table's
    # hash partition: it is never split for its size (only for its load, see make_driver).
    return {"max_store_down_time": STORE_DOWN_S, "store_limit_add_peer": STORE_LIMIT_PER_MIN,
            "store_limit_remove_peer": STORE_LIMIT_PER_MIN, "region_max_size": NEVER, "region_max_keys": NEVER}


def without_merging(driver: Driver) -> None:
    driver.checkers = [c for c in driver.checkers if not isinstance(c, MergeChecker)]


class PDServer:
    def __init__(self, replicas: int, host: str = "127.0.0.1", hot_bytes: float | None = None):
        import uvicorn

        from opforge.placement.service import create_app

        self.token = secrets.token_urlsafe(24)
        self.driver = make_driver(replicas, hot_bytes)
        self.app = create_app(self.driver, None, token=self.token, tick_interval=0)
        self.service = self.app.state.pd
        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((host, 0))
        self.url = f"http://{host}:{self.sock.getsockname()[1]}"
        self.server = uvicorn.Server(uvicorn.Config(self.app, log_level="warning", lifespan="on", access_log=False))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="opforge-pd")

    def start(self, timeout: float = 20.0) -> "PDServer":
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise RuntimeError("opforge.cluster: the placement-driver service did not start")
            time.sleep(0.01)
        return self

    def tick(self) -> list:
        return self.service.tick_once()

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)
        self.sock.close()
