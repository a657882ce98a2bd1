"""A simulator for the placement driver (PD's tools/pd-simulator).

Simulated GPU workers (``node.Node``) hold the true region replicas of a
``simulated_cluster.SimulatedCluster``; they heartbeat the real ``Driver``
on a simulated clock and run the steps it answers, with latency, snapshot
bandwidth, and injectable faults. ``cases`` declares scenarios (balance,
scale-out, store failure, split, merge, hot spots, import, label isolation,
placement rules) with PD's pass criteria; ``runner`` runs them and measures
how the driver did (``run_case``, ``table``, ``plot_case``, ``list_cases``).
"""

from opforge.placement.simulator.runner import CaseResult, list_cases, plot_case, run_case, table

__all__ = ["CaseResult", "list_cases", "plot_case", "run_case", "table"]
