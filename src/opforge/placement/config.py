"""Scheduling configuration, with PD's names and defaults (sizes in MiB)."""

from __future__ import annotations

import math
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
        """Set one field from text or a value, with a clear error for a wrong
        name, type or range. Numbers must be finite and within ``LIMITS``; an
        integer item takes only integral values (``2``, ``2.0``, ``"2"``, not
        ``1.5``). Items are checked one at a time: ``validate()`` checks how
        they fit together."""
        known = {f.name: f for f in fields(self)}
        if name not in known:
            raise ValueError(f"unknown config item {name!r}; known: {sorted(known)}")
        current = getattr(self, name)
        value = _convert(name, current, value)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            lo, hi = limits(name, current)
            if not lo <= value <= hi:
                raise ValueError(f"config item {name!r} must be in [{lo:g}, {hi:g}], got {value!r}")
        setattr(self, name, value)

    def validate(self) -> None:
        """Raise ValueError if the items contradict each other (PD's checks)."""
        if self.low_space_ratio <= self.high_space_ratio:
            raise ValueError(f"config: low_space_ratio ({self.low_space_ratio}) must be larger than "
                             f"high_space_ratio ({self.high_space_ratio})")

    def to_json(self) -> dict:
        return asdict(self)


# (min, max) of the numeric items; others: [0, 2^53] (integers, exact in JSON) or [0, 1e15] (floats)
LIMITS: dict[str, tuple[float, float]] = {
    "max_replicas": (1, 255),
    "low_space_ratio": (0.0, 1.0),
    "high_space_ratio": (0.0, 1.0),
    "hot_region_bytes_threshold": (0.0, 1e18),
}
MAX_TEXT = 256  # characters of a label name
MAX_ITEMS = 64  # names in a list item (location_labels)


def limits(name: str, current) -> tuple[float, float]:
    return LIMITS.get(name) or ((0, 2 ** 53) if isinstance(current, int) else (0.0, 1e15))


def _convert(name: str, current, value):
    def bad(expected: str):
        return ValueError(f"config item {name!r} takes {expected}, got {value!r}")

    if isinstance(current, bool):
        return value if isinstance(value, bool) else str(value).lower() in ("1", "true", "yes", "on")
    if isinstance(current, (int, float)):
        if isinstance(value, bool) or not isinstance(value, (int, float, str)):
            raise bad("a number")
        try:
            number = float(value) if isinstance(value, str) else value
        except ValueError:
            raise bad("a number") from None
        if isinstance(number, float) and not math.isfinite(number):
            raise bad("a finite number")
        if isinstance(current, int):
            if isinstance(number, float) and not number.is_integer():
                raise bad("an integer")
            return int(value) if isinstance(value, str) and value.strip().lstrip("+-").isdigit() else int(number)
        return float(number)
    if isinstance(current, list):
        items = value.split(",") if isinstance(value, str) else value
        if not isinstance(items, (list, tuple)) or len(items) > MAX_ITEMS or \
                not all(isinstance(v, str) and len(v) <= MAX_TEXT for v in items):
            raise bad(f"a list of at most {MAX_ITEMS} names (strings of at most {MAX_TEXT} characters)")
        return [v for v in items if v]
    if not isinstance(value, str) or len(value) > MAX_TEXT:
        raise bad(f"a string of at most {MAX_TEXT} characters")
    return value


def config_schema() -> dict:
    """The JSON Schema of a config change (``PUT config``): any subset of the items, each bounded."""
    props: dict = {}
    for f in fields(ScheduleConfig):
        current = getattr(ScheduleConfig(), f.name)
        if isinstance(current, bool):
            props[f.name] = {"type": "boolean"}
        elif isinstance(current, (int, float)):
            lo, hi = limits(f.name, current)
            props[f.name] = {"type": "integer" if isinstance(current, int) else "number", "minimum": lo,
                             "maximum": hi}
        elif isinstance(current, list):
            props[f.name] = {"type": "array", "maxItems": MAX_ITEMS, "items": {"type": "string", "maxLength": MAX_TEXT}}
        else:
            props[f.name] = {"type": "string", "maxLength": MAX_TEXT}
    return {"type": "object", "minProperties": 1, "additionalProperties": False, "properties": props}
