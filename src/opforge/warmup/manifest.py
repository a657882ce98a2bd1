"""The warm-up manifests: per engine, the kernel specializations to compile.

One JSON file per engine in ``opforge/warmup/manifests/`` (``sql``,
``stream``, ``ops``), shipped in the package. The file is written the same
way every time (entries sorted, one entry per line, keys sorted), so a
regenerated manifest diffs by the specializations that changed.

``recipes`` says which recordings the entries are the union of (workload,
scale, device); ``sources`` holds the text of generated kernels
(``opforge.fuse``) by module name, from which they are rebuilt.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from opforge.warmup.launches import Specialization

ENGINES = ("sql", "stream", "ops")
VERSION = 1
DIRECTORY = Path(__file__).resolve().parent / "manifests"


def path(engine: str, directory: Path | None = None) -> Path:
    if engine not in ENGINES:
        raise ValueError(f"opforge warmup: engine must be one of {list(ENGINES)}, got {engine!r}")
    return Path(directory or DIRECTORY) / f"{engine}.json"


@dataclass
class Manifest:
    engine: str
    entries: dict[str, Specialization] = field(default_factory=dict)  # key -> specialization
    sources: dict[str, str] = field(default_factory=dict)
    recipes: set[str] = field(default_factory=set)

    def add(self, specializations, sources: dict[str, str], recipe: str) -> int:
        """Merge a recording; returns how many entries are new."""
        before = len(self.entries)
        for s in specializations:
            self.entries.setdefault(s.key(), s)
        self.sources.update(sources)
        self.recipes.add(recipe)
        return len(self.entries) - before

    def missing(self, specializations) -> list[Specialization]:
        """Those of ``specializations`` this manifest lacks."""
        return sorted((s for s in specializations if s.key() not in self.entries), key=Specialization.key)

    def dumps(self) -> str:
        keys = sorted(self.entries)
        used = {self.entries[k].module for k in keys}
        lines = [
            "{",
            f'"version": {VERSION},',
            f'"engine": {json.dumps(self.engine)},',
            f'"recipes": {json.dumps(sorted(self.recipes), indent=1)},',
            f'"sources": {json.dumps({m: s for m, s in sorted(self.sources.items()) if m in used}, indent=1)},',
            '"entries": [',
            ",\n".join(keys),
            "]",
            "}",
        ]
        return "\n".join(lines) + "\n"

    def save(self, directory: Path | None = None) -> Path:
        p = path(self.engine, directory)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(self.dumps())
        return p


def loads(text: str, engine: str) -> Manifest:
    d = json.loads(text)
    if d.get("version") != VERSION or d.get("engine") != engine:
        raise ValueError(f"opforge warmup: {engine} manifest has version {d.get('version')} and engine "
                         f"{d.get('engine')!r}; expected {VERSION} and {engine!r}")
    entries = [Specialization.from_json(e) for e in d["entries"]]
    return Manifest(engine, {s.key(): s for s in entries}, dict(d.get("sources", {})), set(d.get("recipes", [])))


def load(engine: str, directory: Path | None = None) -> Manifest:
    """The manifest of ``engine`` (an empty one when none was recorded yet)."""
    p = path(engine, directory)
    if not p.exists():
        return Manifest(engine)
    return loads(p.read_text(), engine)
