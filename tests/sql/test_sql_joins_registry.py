"""The join algorithm registry (``sql/physical/joins``): each algorithm's eligibility, label and
pairs on its own, the planner's and executor's lookups, the layering (the planner reads the
algorithms, never the executor), and a new algorithm taken up from its module alone."""
import ast
from pathlib import Path

import pyarrow as pa
import pytest
import torch

import opforge.sql as sql
from opforge.sql.physical import joins
from opforge.sql.physical.joins.base import (
    DENSE_RANGE_PER_ROW, HASH_BYTES_PER_ROW, Hardware, JoinAlgorithm, JoinRun, JoinSizes, SideInfo,
)
from opforge.sql.physical.joins.merge import merge_pairs
from opforge.sql.physical.joins.nested_loop import NESTED_LOOP_MAX_PAIRS
from opforge.sql.planner.physical_choice import choose

HW = Hardware()
SQL = Path(joins.__file__).resolve().parents[2]


def test_registry_holds_one_algorithm_per_module_in_the_planners_order():
    modules = sorted(p.stem for p in Path(joins.__file__).parent.glob("*.py") if p.stem not in ("__init__", "base"))
    assert joins.names() == tuple(modules) == ("direct", "hash", "merge", "nested_loop", "radix")
    assert [a.name for a in joins.ALGORITHMS] == ["radix", "hash", "direct", "merge", "nested_loop"]
    for name in joins.names():
        assert isinstance(joins.get(name), JoinAlgorithm) and joins.get(name).name == name
    with pytest.raises(ValueError, match="unknown join algorithm 'perfect'"):
        joins.get("perfect")


def test_planner_names_map_back_to_algorithms():
    assert joins.for_choice("hash", True).name == "radix"
    assert joins.for_choice("hash", False).name == "hash"
    for name in ("direct", "merge", "nested_loop"):
        assert joins.for_choice(name, False).name == name
    with pytest.raises(ValueError):
        joins.for_choice("merge", True)
    assert joins.without_keys().name == "nested_loop"


@pytest.mark.parametrize("name, build, probe, hw, expected", [
    ("hash", SideInfo(1e6, 8), SideInfo(1e7, 8), HW, True),
    ("hash", SideInfo(1e6, 8), SideInfo(1e7, 8), Hardware(table_budget=1e6), False),  # 48 MB table
    ("radix", SideInfo(1e6, 8), SideInfo(1e7, 8), Hardware(table_budget=1e6), True),
    ("direct", SideInfo(1e4, 8, dense_range=DENSE_RANGE_PER_ROW * 1e4), SideInfo(1e7, 8), HW, True),
    ("direct", SideInfo(1e4, 8, dense_range=DENSE_RANGE_PER_ROW * 1e4 + 1), SideInfo(1e7, 8), HW, False),
    ("direct", SideInfo(1e4, 8), SideInfo(1e7, 8), HW, False),  # no dense key known
    ("merge", SideInfo(1e9, 8), SideInfo(1e9, 8), HW, True),
    ("nested_loop", SideInfo(64, 8), SideInfo(NESTED_LOOP_MAX_PAIRS / 64, 8), HW, True),
    ("nested_loop", SideInfo(65, 8), SideInfo(NESTED_LOOP_MAX_PAIRS / 64, 8), HW, False),
])
def test_each_algorithm_is_eligible_on_its_own(name, build, probe, hw, expected):
    assert joins.get(name).eligible(build, probe, hw) is expected


def test_each_algorithm_costs_and_explains_itself():
    b, p = SideInfo(2e6, 16, dense_range=2e6), SideInfo(1e8, 16)
    s = JoinSizes(b.rows, b.width, p.rows, p.width, p.rows, 32)
    costs = {a.name: a.cost(s, b, p, HW) for a in joins.ALGORITHMS}
    assert all(c > 0 for c in costs.values())
    assert costs["direct"] < costs["hash"]  # 16 MB of slots vs a 96 MB table probed in HBM
    assert costs["nested_loop"] > costs["merge"]  # 2e14 pairs
    assert joins.get("hash").reason(b, p, HW) == f"table {2e6 * HASH_BYTES_PER_ROW / 1e6:.3g} MB in HBM (50 MB)"
    assert "L2-sized radix partitions" in joins.get("radix").reason(b, p, HW)
    assert joins.get("direct").reason(b, p, HW) == "unique dense int keys, range 2000000"
    assert joins.get("merge").reason(b, p, HW) == "sorts the build side"
    tiny = joins.get("nested_loop").reason(SideInfo(3, 8), SideInfo(5, 8), HW)
    assert tiny == f"3 x 5 pairs <= {NESTED_LOOP_MAX_PAIRS}"


def test_labels_name_the_operator_in_explain_analyze():
    assert joins.get("hash").label(False, None) == "hash join"
    assert joins.get("radix").label(False, 3) == "radix-partitioned hash join (8 parts)"
    assert joins.get("direct").label(False, None) == "perfect-hash (direct) join"
    assert joins.get("merge").label(True, None) == "merge join (inputs already sorted)"
    assert joins.get("merge").label(False, None) == "sort-merge join (sorts the right side)"
    assert joins.get("nested_loop").label(False, None) == "nested-loop join"


def test_run_time_rules_and_guards():
    assert joins.unplanned(10, 10, False).name == "nested_loop"
    assert joins.unplanned(1000, 1000, True).name == "merge"
    assert joins.unplanned(1000, 1000, False).name == "hash"
    assert joins.get("nested_loop").planned_guard(10, 10) is None
    assert "pairs >" in joins.get("nested_loop").planned_guard(10 ** 4, 10 ** 4)
    assert joins.get("hash").planned_guard(10 ** 6, 10 ** 6) is None

    class Ctx:
        memory_budget = None

    radix = joins.get("radix")
    assert radix.partitions(10, Ctx, forced=True) == 2 and radix.partitions(10, Ctx, forced=False) == 0
    assert joins.get("hash").partitions(10 ** 9, Ctx, forced=True) is None


@pytest.mark.parametrize("name", ["hash", "radix", "direct", "merge", "nested_loop"])
@pytest.mark.parametrize("build", ["left", "right", "smaller"])
def test_each_algorithm_finds_the_inner_pairs(name, build):
    g = torch.Generator().manual_seed(5)
    lk = torch.randint(0, 60, (90,), generator=g)
    rk = torch.randperm(80, generator=g)[:50]  # unique: the direct join keeps its perfect hash
    lv = torch.rand(90, generator=g) > 0.1
    run = JoinRun(build=build, bits=1 if name == "radix" else None)
    li, ri = joins.get(name).pairs(lk, rk, lv, None, run)
    got = sorted(zip(li.tolist(), ri.tolist()))
    want = sorted((i, j) for i in range(90) for j in range(50) if lv[i] and lk[i] == rk[j])
    assert got == want


@pytest.mark.parametrize("name", [a.name for a in joins.ALGORITHMS if a.probes_outer])
def test_outer_probes_agree_with_the_hash_kernel(name):
    g = torch.Generator().manual_seed(6)
    bk = torch.randperm(70, generator=g)[:40]
    pk = torch.randint(0, 70, (100,), generator=g)

    class Ctx:
        def note(self, text):
            raise AssertionError(text)  # no fallback: the keys are unique and dense

    for how in ("inner", "left", "semi", "anti"):
        bi, pi = joins.get(name).probe(bk, pk, None, None, how, JoinRun(ctx=Ctx()))
        hb, hp = joins.get("hash").probe(bk, pk, None, None, how, JoinRun())
        assert torch.equal(pi, hp), how
        if how in ("inner", "left"):
            assert torch.equal(bi, hb), how


def _top_level_imports(path: Path) -> list[str]:
    """Module-level imports as dotted names (``from a import b`` gives ``a.b``)."""
    out = []
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            out += [f"{node.module}.{a.name}" for a in node.names]
        elif isinstance(node, ast.Import):
            out += [a.name for a in node.names]
    return out


def _under(mod: str, package: str) -> bool:
    return mod == package or mod.startswith(package + ".")


def test_the_planner_reads_the_algorithms_not_the_executor():
    """Planner modules import from ``sql/physical`` only the ``joins`` package; the algorithm
    modules import nothing of the executor or the planner at module level (what they run with,
    they import inside ``pairs`` / ``probe``)."""
    for path in sorted((SQL / "planner").glob("*.py")):
        for mod in _top_level_imports(path):
            if _under(mod, "opforge.sql.physical"):
                assert _under(mod, "opforge.sql.physical.joins"), (path.name, mod)
            assert not _under(mod, "opforge.sql.executor"), (path.name, mod)
    for path in sorted((SQL / "physical" / "joins").glob("*.py")):
        for mod in _top_level_imports(path):
            if mod.startswith("opforge."):
                assert _under(mod, "opforge.sql.physical.joins"), (path.name, mod)


class ToyJoin(JoinAlgorithm):
    """A made-up algorithm that always wins: sort-merge under another name."""

    name = "toy"
    rank = -1

    def cost(self, s, build, probe, hw):
        return 0.0

    def reason(self, build, probe, hw):
        return "costs nothing"

    def label(self, presorted, bits):
        return "toy join"

    def pairs(self, lkey, rkey, lvalid, rvalid, run):
        return merge_pairs(lkey, rkey, lvalid, rvalid)


def test_a_new_module_is_discovered(tmp_path, monkeypatch):
    pkg = tmp_path / "toyjoins"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "toy.py").write_text(f"from {__name__} import ToyJoin\nALGORITHM = ToyJoin()\n")
    (pkg / "wrong.py").write_text(f"from {__name__} import ToyJoin\nALGORITHM = ToyJoin()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(TypeError, match="named 'wrong'"):
        joins.discover([str(pkg)], "toyjoins")
    (pkg / "wrong.py").unlink()
    [algo] = joins.discover([str(pkg)], "toyjoins")
    assert algo.name == "toy"


def test_a_registered_algorithm_is_planned_forced_and_run(monkeypatch):
    """Registering is all it takes: the planner prices it, EXPLAIN names it, the executor runs it,
    and ``join_algorithm=`` accepts its name."""
    monkeypatch.setattr(joins, "ALGORITHMS", (ToyJoin(), *joins.ALGORITHMS))
    c = choose(SideInfo(1e6, 8), SideInfo(1e3, 8), 1e6, True)
    assert (c.algorithm, c.build, c.describe()) == ("toy", "right", "toy build=right: costs nothing")
    fact = pa.table({"k": pa.array([i % 7 for i in range(300)], pa.int64()), "v": pa.array(range(300), pa.int64())})
    dim = pa.table({"d": pa.array(range(5), pa.int64()), "w": pa.array([10, 20, 30, 40, 50], pa.int64())})
    q = "SELECT w, count(*) AS n, sum(v) AS s FROM fact JOIN dim ON k = d GROUP BY w ORDER BY w"
    want = sql.connect("cpu", join_algorithm="hash").register("fact", fact).register("dim", dim).sql(q).to_arrow()
    for algorithm in ("auto", "toy"):
        con = sql.connect("cpu", join_algorithm=algorithm)
        con.register("fact", fact).register("dim", dim)
        assert con.sql(q).to_arrow().equals(want)
        notes = " ".join(con.sql("EXPLAIN ANALYZE " + q).to_pandas()["notes"])
        assert "toy join" in notes
        assert ("rule: planner (physical_choice): toy build=" in notes) if algorithm == "auto" else \
            ("rule: join_algorithm=toy (user override)" in notes)
