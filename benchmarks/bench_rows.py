"""The row log of a benchmark that must fit one device call: each row appended to
``<out>.partial.jsonl`` as it finishes (a call cut short keeps them), no new item started once the
run's time plus the last item's would pass the budget, and the final JSON written over the rows."""
from __future__ import annotations

import json
import time
from pathlib import Path


class RowLog:
    def __init__(self, out: Path, budget_s: float):
        self.out, self.budget_s = out, budget_s
        self.begin = time.perf_counter()
        out.parent.mkdir(parents=True, exist_ok=True)
        self.partial = out.with_suffix(".partial.jsonl")
        self.partial.unlink(missing_ok=True)
        self.entries: list[dict] = []
        self.skipped: list[str] = []
        self._last_s = 0.0
        self._item_start = self.begin

    def say(self, text: str) -> None:
        print(f"{text}  [{time.perf_counter() - self.begin:.0f} s]", flush=True)

    def start(self, name: str) -> bool:
        """False (and ``name`` recorded as skipped) when the budget leaves no time for it."""
        now = time.perf_counter()
        if now - self.begin + self._last_s > self.budget_s:
            self.skipped.append(name)
            return False
        self._item_start = now
        return True

    def add(self, entry: dict) -> None:
        self.entries.append(entry)
        with self.partial.open("a") as f:
            f.write(json.dumps(entry) + "\n")
        self._last_s = time.perf_counter() - self._item_start

    def finish(self, header: dict) -> int:
        """Write the JSON (``header`` + skipped + entries); 0 when every entry is equal to its reference."""
        if self.skipped:
            self.say(f"budget of {self.budget_s:g} s reached: skipped {', '.join(self.skipped)}")
        self.out.write_text(json.dumps({**header, "skipped": self.skipped, "entries": self.entries}, indent=1))
        self.partial.unlink(missing_ok=True)
        self.say(f"wrote {self.out}")
        return 0 if all(e["equal"] for e in self.entries) else 1
