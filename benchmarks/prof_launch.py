import cProfile, pstats, io, os, sys, time
import torch, opforge
from opforge.ops import matmul as MM
from opforge.runtime import dispatch
dev = torch.device("cuda")
a = torch.randn(256, 1024, device=dev, dtype=torch.bfloat16)
b = torch.randn(11008, 1024, device=dev, dtype=torch.bfloat16).t()
q = torch.randn(1, 1, 32, 128, device=dev, dtype=torch.bfloat16)
k = torch.randn(1, 8192, 8, 128, device=dev, dtype=torch.bfloat16); v = torch.randn_like(k)
sl = torch.full((1,), 8192, dtype=torch.int32, device=dev)
x = torch.randn(64, 64, device=dev)
cases = {
 "matmul_tma": ("matmul", "triton_tma_persistent", lambda: opforge.matmul(a, b)),
 "matmul_tiled": ("matmul", "triton_tiled", lambda: opforge.matmul(a, b)),
 "decode": ("attention_decode", "triton_split_kv", lambda: opforge.attention_decode(q, k, v, sl)),
 "softmax": ("softmax", None, lambda: opforge.softmax(x, dim=-1)),
 "add": ("add", None, lambda: opforge.add(x, x)),
}
for name, (op, var, fn) in cases.items():
    import contextlib
    ctx = dispatch.force_variant(op, var) if var else contextlib.nullcontext()
    with ctx:
        for _ in range(20): fn()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(500): fn()
        t = (time.perf_counter() - t0) / 500 * 1e6
        torch.cuda.synchronize()
        pr = cProfile.Profile(); pr.enable()
        for _ in range(500): fn()
        pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
    print(f"===== {name}: {t:.1f} us/call (no profiler), variant {dispatch.decide(__import__('opforge.runtime.registry', fromlist=['get']).get(op), (), tune=False) if False else ''}")
    print(s.getvalue()[:6000])
