"""Every bench family's quick cases run and pass their correctness check on CPU
(the Triton interpreter), one family per test so they spread over workers."""

import pytest
from rich.console import Console

from opforge.bench import families, harness


@pytest.mark.parametrize("family", families.names())
def test_quick_cases_of_each_family_are_correct(family):
    result = harness.run(quick=True, families=[family], crossover=False, host=False,
                         console=Console(quiet=True))
    assert result["entries"], family
    for e in result["entries"]:
        assert "error" not in e, e
        assert e["correct"], e
        assert e["median_ms"] > 0 and e["bytes"] > 0


def test_case_filter_keeps_only_matching_cases():
    # two cheap families (scan and reduce took a minute under the interpreter for the same check)
    result = harness.run(quick=True, families=["transpose", "elementwise"], crossover=False, host=False,
                         console=Console(quiet=True), cases=["transpose 64x96", "gelu 64x256"])
    assert sorted(e["op"] for e in result["entries"]) == ["opforge::gelu", "opforge::transpose"]
