"""Bench families are found, not listed: a new module in opforge.bench that
defines ``cases`` is a family for ``opforge bench``, prewarm workers and tune."""

import textwrap

import pytest
import torch
from rich.console import Console

import opforge.bench
from opforge import tune
from opforge.bench import families, harness, prewarm


def test_every_family_module_is_found_and_no_support_module_is():
    found = families.names()
    assert {"elementwise", "softmax", "gemm", "attention", "hashing", "nexmark"} <= set(found)
    assert not {"harness", "prewarm", "case", "plot", "overhead", "families"} & set(found)
    assert list(found) == sorted(found)


def test_an_unknown_family_names_the_known_ones():
    with pytest.raises(ValueError, match="unknown bench family 'nope'.*softmax"):
        families.get("nope")


@pytest.fixture
def extra_family(tmp_path, monkeypatch):
    """One new module dropped into the bench package (on a second path entry)."""
    (tmp_path / "zz_probe.py").write_text(textwrap.dedent('''
        import torch
        from opforge.bench.case import BenchCase
        import opforge

        def cases(device, quick):
            def make(dev):
                return (torch.linspace(-1, 1, 64, device=dev),)
            return [BenchCase(op="gelu", label="64", dtype=torch.float32, make_args=make,
                              run=lambda x: opforge.gelu(x), reference=lambda x: torch.nn.functional.gelu(x),
                              flops=64, nbytes=512)]
    '''))
    monkeypatch.setattr(opforge.bench, "__path__", list(opforge.bench.__path__) + [str(tmp_path)])
    families.names.cache_clear()
    yield "zz_probe"
    families.names.cache_clear()


def test_one_new_module_is_a_family_everywhere(extra_family):
    assert extra_family in families.names()
    result = harness.run(quick=True, families=[extra_family], crossover=False, host=False,
                         console=Console(quiet=True))
    assert [e["op"] for e in result["entries"]] == ["opforge::gelu"] and result["entries"][0]["correct"]
    assert [j.op for j in tune.bench_jobs(True, [extra_family])] == ["gelu"]
    assert harness.case_name(harness.find_case("gelu 64 float32", torch.device("cpu"), quick=True)) == \
        "gelu 64 float32"
    assert families.family_cases(extra_family, "crossover", torch.device("cpu"), True) == []
    prewarm.worker([(extra_family, "entries", 0)], quick=True)  # a worker rebuilds the case by name
