"""Run as a fresh process (TRITON_INTERPRET=0): load a compiled manifest entry from Triton's cache
and run Triton's own ``CudaLauncher`` up to its build call, printing as JSON the source and module
name it asks ``compile_module_from_src`` for and whether the cache already holds that module."""

import json
import sys

import triton.backends.nvidia.driver as nv

from opforge.warmup.compile import compile_entry
from opforge.warmup.launches import Specialization
from opforge.warmup.launchers import cached_launcher


class Asked(Exception):
    pass


def record(src, name, **_):
    raise Asked(src, name)


spec = Specialization.from_json(json.loads(sys.argv[1]))
compiled = compile_entry(spec, {}, arch=int(sys.argv[2]))  # a cache hit: what the warmup compiled
nv.library_dirs = lambda: []  # no CUDA driver here; only the build would use these
nv.compile_module_from_src = record
try:
    nv.CudaLauncher(compiled.src, compiled.metadata)
except Asked as e:
    src, name = e.args
    print(json.dumps({"src": src, "name": name, "cached": cached_launcher(src) is not None}))
