"""The placement driver: PD-style scheduling of data regions across GPU workers.

Stores are GPU workers (capacity = device memory); regions are key ranges of
distributed tables and keyed stream state. The driver learns the cluster from
store and region heartbeats, runs schedulers and checkers that propose
Operators (sequences of steps), and answers each region heartbeat with the
step its leader should run now. Names follow TiKV's PD.
"""
