"""Scheduling configuration, with PD's names and defaults (sizes in MiB)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, fields


@dataclass
class ScheduleConfig:
    max_replicas: int = 3
    location_labels: list[str] = field(default_factory=list)  # e.g. ["zone", "host"]
    isolation_level: str = ""  # a label every replica must differ on, e.g. "zone"
    max_store_down_time: float = 30.0  # seconds without a heartbeat before a store is down
    # how many operators of each kind may run at once
    leader_schedule_limit: int = 4
    region_schedule_limit: int = 2048
    replica_schedule_limit: int = 64
    merge_schedule_limit: int = 8
    hot_region_schedule_limit: int = 4
    # per-store rate limits, in peers per minute (token buckets)
    store_limit_add_peer: float = 15.0
    store_limit_remove_peer: float = 15.0
    # balance
    tolerant_size_ratio: float = 0.0  # 0: derived from the average region size
    low_space_ratio: float = 0.8
    high_space_ratio: float = 0.7
    # merge and split
    max_merge_region_size: int = 20
    max_merge_region_keys: int = 200_000
    split_merge_interval: float = 3600.0
    region_max_size: int = 144
    region_max_keys: int = 1_440_000
    # hot regions: a region is hot when its flow exceeds these per second
    hot_region_bytes_threshold: float = 8 * 1024 * 1024
    hot_region_keys_threshold: float = 8 * 1024
    hot_region_query_threshold: float = 128
    patrol_regions_per_tick: int = 2048  # checkers per tick; a full patrol spans ticks, like PD's

    def set(self, name: str, value) -> None:
        """Set one field from text or a value, with a clear error for a wrong name or type."""
        known = {f.name: f for f in fields(self)}
        if name not in known:
            raise ValueError(f"unknown config item {name!r}; known: {sorted(known)}")
        current = getattr(self, name)
        try:
            if isinstance(current, bool):
                value = value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
            elif isinstance(current, int):
                value = int(value)
            elif isinstance(current, float):
                value = float(value)
            elif isinstance(current, list):
                value = [v for v in (value.split(",") if isinstance(value, str) else value) if v]
            else:
                value = str(value)
        except (TypeError, ValueError):
            raise ValueError(f"config item {name!r} takes a {type(current).__name__}, got {value!r}") from None
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value < 0:
            raise ValueError(f"config item {name!r} must be >= 0, got {value}")
        setattr(self, name, value)

    def to_json(self) -> dict:
        return asdict(self)
