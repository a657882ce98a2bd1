"""Compiled resources of a Triton kernel config, without a GPU.

Triton compiles for Hopper on any machine (``GPUTarget("cuda", 90, 32)``); the
metadata gives shared memory and warps, and Triton's bundled ``ptxas -v`` gives
registers and spills. Compilation runs in a child process with
``TRITON_INTERPRET=0`` (kernels decorated under the interpreter, as in the
test suite, cannot compile), which imports the kernel by its ``"module:function"``
name; a ``triton.jit`` object is accepted and turned into that name.

``op_resources`` asks dispatch which Triton variant and config an opforge op
would run for example tensors, then runs that variant's launch code in the
child with kernel launches captured instead of run, and compiles each captured
launch. This is generic over every Triton variant that launches through
``kernel[grid](...)``; it does not need per-op signature tables.
"""

from __future__ import annotations

import contextlib
import inspect
import json
import os
import pickle
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass, field
from typing import Any

from opforge.profile.occupancy import Limits, Occupancy, theoretical_occupancy
from opforge.runtime.names import resolve

_LAUNCH_OPTIONS = {"num_warps", "num_stages", "num_ctas", "maxnreg", "enable_fp_fusion",
                   "launch_cooperative_grid", "launch_pdl", "debug", "sanitize_overflow"}


class ProfileError(RuntimeError):
    """Compiling or measuring a kernel's resources failed."""


@dataclass
class Resources:
    kernel: str
    registers: int
    spill_stores: int
    spill_loads: int
    shared_bytes: int
    num_warps: int
    num_stages: int
    occupancy: Occupancy
    arch: int = 90
    signature: dict = field(default_factory=dict)
    constexprs: dict = field(default_factory=dict)
    note: str = ""  # e.g. the op's host code stopped before its later launches

    def to_dict(self) -> dict:
        d = asdict(self)
        d["occupancy"] = self.occupancy.to_dict()
        d["constexprs"] = {k: str(v) for k, v in self.constexprs.items()}
        return d

    def __str__(self) -> str:
        return (f"{self.kernel}: {self.registers} regs/thread, spills {self.spill_stores}B st / "
                f"{self.spill_loads}B ld, {self.shared_bytes}B shared, {self.num_warps} warps, "
                f"{self.num_stages} stages -> {self.occupancy}")


# ---------------------------------------------------------------------------
# ptxas
# ---------------------------------------------------------------------------
def ptxas_path() -> str:
    """Triton's bundled ptxas (or $TRITON_PTXAS_PATH); ProfileError when missing."""
    env = os.environ.get("TRITON_PTXAS_PATH")
    if env:
        if os.path.isfile(env) and os.access(env, os.X_OK):
            return env
        raise ProfileError(f"TRITON_PTXAS_PATH={env} is not an executable file")
    try:
        import triton
    except ImportError as e:
        raise ProfileError("triton is not installed: cannot compile kernels for resources") from e
    path = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise ProfileError(f"ptxas not found at {path} (Triton's NVIDIA backend ships it; "
                           "set TRITON_PTXAS_PATH to a CUDA ptxas to use another)")
    return path


def parse_ptxas(text: str) -> dict[str, int]:
    """Registers and spill bytes from ``ptxas -v`` output (the last function reported)."""
    regs = re.findall(r"Used (\d+) registers", text)
    st = re.findall(r"(\d+) bytes spill stores", text)
    ld = re.findall(r"(\d+) bytes spill loads", text)
    if not regs:
        raise ProfileError(f"could not find 'Used N registers' in ptxas output:\n{text[-2000:]}")
    return {"registers": int(regs[-1]), "spill_stores": int(st[-1]) if st else 0,
            "spill_loads": int(ld[-1]) if ld else 0}


def run_ptxas(ptx: str, arch: int = 90) -> dict[str, int]:
    exe = ptxas_path()
    sm = f"sm_{arch}a" if arch >= 90 else f"sm_{arch}"
    with tempfile.TemporaryDirectory(prefix="opforge-ptxas-") as d:
        src, out = os.path.join(d, "k.ptx"), os.path.join(d, "k.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        r = subprocess.run([exe, f"-arch={sm}", "-v", src, "-o", out], capture_output=True, text=True)
        if r.returncode != 0:
            raise ProfileError(f"ptxas failed ({r.returncode}):\n{r.stderr[-2000:]}")
        return parse_ptxas(r.stdout + r.stderr)


# ---------------------------------------------------------------------------
# kernels by name
# ---------------------------------------------------------------------------
def kernel_name(fn) -> str:
    """``"module:function"`` for a jit function (or the string itself)."""
    if isinstance(fn, str):
        if ":" not in fn:
            raise ValueError(f"kernel name must be 'module:function', got {fn!r}")
        return fn
    inner = getattr(fn, "fn", None)
    if inner is None or not callable(inner):
        raise TypeError(f"expected a triton.jit function or 'module:function', got {type(fn).__name__}")
    mod, name = inner.__module__, inner.__qualname__
    if mod == "__main__" or "<locals>" in name:
        raise ValueError(f"{mod}:{name} cannot be imported by name in a child process; "
                         "define the kernel at the top level of an importable module")
    return f"{mod}:{name}"




def _source(fn, plain):
    """The compiler's source class for ``fn``: Gluon kernels (explicit layouts) have their own."""
    if getattr(fn, "is_gluon", lambda: False)():
        from triton.experimental.gluon._runtime import GluonASTSource

        return GluonASTSource
    return plain


def _compile_local(fn, signature: dict, constexprs: dict, num_warps: int, num_stages: int, arch: int) -> dict:
    """In a process where TRITON_INTERPRET is off: compile and read resources."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    full = dict(signature)
    for k in constexprs:
        full[k] = "constexpr"
    names = [p.name for p in fn.params]
    missing = [n for n in names if n not in full]
    if missing:
        raise ProfileError(f"signature lacks parameters {missing} of {fn.__name__}")
    full = {n: full[n] for n in names}
    k = triton.compile(_source(fn, ASTSource)(fn, full, dict(constexprs)), target=GPUTarget("cuda", arch, 32),
                       options={"num_warps": num_warps, "num_stages": num_stages})
    res = run_ptxas(k.asm["ptx"], arch)
    md = k.metadata
    res.update(shared_bytes=int(getattr(md, "shared", 0) or 0), num_warps=int(md.num_warps),
               num_stages=int(getattr(md, "num_stages", num_stages)))
    return res


def _compile_launch(fn, args: tuple, kwargs: dict, arch: int) -> dict:
    """Compile ``fn[grid](*args, **kwargs)`` as the JIT would on sm_``arch``: the
    same binder gives the same signature, constexprs and specializations
    (16-byte-aligned pointers, integers divisible by 16), so loads vectorize
    as they do on the GPU."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource, make_backend
    from triton.runtime.jit import create_function_from_signature

    target = GPUTarget("cuda", arch, 32)
    backend = make_backend(target)
    binder = create_function_from_signature(fn.signature, fn.params, backend)
    kwargs = {k: v for k, v in kwargs.items() if k not in ("debug", "instrumentation_mode")}
    bound, specialization, opts = binder(*args, **kwargs)
    options, signature, constexprs, attrs = fn._pack_args(backend, kwargs, bound, specialization, opts)
    k = triton.compile(_source(fn, ASTSource)(fn, signature, constexprs, attrs), target=target,
                       options=options.__dict__)
    res = run_ptxas(k.asm["ptx"], arch)
    md = k.metadata
    names = [p.name for p in fn.params]
    sig = {n: t for n, t in signature.items() if t != "constexpr"}
    const = {names[path[0]]: str(v) for path, v in constexprs.items() if len(path) == 1}
    res.update(shared_bytes=int(getattr(md, "shared", 0) or 0), num_warps=int(md.num_warps),
               num_stages=int(getattr(md, "num_stages", options.num_stages)), signature=sig, constexprs=const,
               kernel=f"{fn.fn.__module__}:{fn.fn.__qualname__}" if hasattr(fn, "fn") else fn.__name__)
    return res


def _compile_captured(fn, a: tuple, kw: dict, arch: int) -> dict:
    """One captured launch: the JIT's own specialization, else the plain signature."""
    try:
        return _compile_launch(fn, a, dict(kw), arch)
    except ProfileError:
        raise
    except Exception:  # a binder this Triton lacks: compile unspecialized
        sig, const, opts = _signature_of_launch(fn, a, dict(kw))
        res = _compile_local(fn, sig, const, opts.get("num_warps", 4), opts.get("num_stages", 3), arch)
        res.update(kernel=f"{fn.fn.__module__}:{fn.fn.__qualname__}", signature=sig,
                   constexprs={k: str(x) for k, x in const.items()})
        return res


# ---------------------------------------------------------------------------
# the child process
# ---------------------------------------------------------------------------
def _child_env() -> dict:
    env = dict(os.environ)
    env["TRITON_INTERPRET"] = "0"
    env["OPFORGE_INTERPRET"] = "0"
    # the child imports what this process can (a kernel module found through
    # sys.path, as pytest's rootdir imports are)
    paths = [p for p in sys.path if p and os.path.isdir(p)]
    env["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths + env.get("PYTHONPATH", "").split(os.pathsep)))
    env.setdefault("TRITON_CACHE_DIR", os.path.join(tempfile.gettempdir(), "opforge-profile-triton-cache"))
    return env


def _in_child(jobs: list[dict], timeout: float = 600, raise_errors: bool = True, workers: int = 1) -> list[dict]:
    """Run compile ``jobs`` in a child process (``workers`` > 1: that many children
    side by side, on contiguous slices); results in the jobs' order."""
    if workers > 1 and len(jobs) > 1:
        from concurrent.futures import ThreadPoolExecutor

        step = -(-len(jobs) // min(workers, len(jobs)))
        slices = [jobs[i:i + step] for i in range(0, len(jobs), step)]
        with ThreadPoolExecutor(len(slices)) as pool:
            parts = list(pool.map(lambda sl: _in_child(sl, timeout, raise_errors), slices))
        return [res for part in parts for res in part]
    r = subprocess.run([sys.executable, "-m", "opforge.profile.resources"], input=pickle.dumps(jobs),
                       capture_output=True, env=_child_env(), timeout=timeout)
    out = r.stdout.decode(errors="replace")
    marker = out.rfind("\n@@OPFORGE@@")
    if r.returncode != 0 or marker < 0:
        raise ProfileError(f"compile child failed ({r.returncode}):\n{r.stderr.decode(errors='replace')[-3000:]}")
    results = json.loads(out[marker + len("\n@@OPFORGE@@"):])
    for res in results:
        if "error" in res and raise_errors:
            raise ProfileError(res["error"])
    return results


def _signature_of_launch(fn, args: tuple, kwargs: dict) -> tuple[dict, dict, dict]:
    """(signature, constexprs, options) of one ``kernel[grid](*args, **kwargs)`` call."""
    import torch

    opts = {k: kwargs.pop(k) for k in list(kwargs) if k in _LAUNCH_OPTIONS}
    bound = fn.signature.bind(*args, **kwargs)
    bound.apply_defaults()
    sig, const = {}, {}
    for p in fn.params:
        v = bound.arguments[p.name]
        if p.is_constexpr or v is None:
            const[p.name] = v
        elif isinstance(v, torch.Tensor):
            sig[p.name] = "*" + _torch_to_triton()[v.dtype]
        elif isinstance(v, bool):
            sig[p.name] = "i1"
        elif isinstance(v, int):
            sig[p.name] = "i32" if -2**31 <= v < 2**31 else ("i64" if -2**63 <= v < 2**63 else "u64")
        elif isinstance(v, float):
            sig[p.name] = "fp32"
        else:
            raise ProfileError(f"cannot type argument {p.name}={v!r} of {fn.__name__}")
    return sig, const, opts


_DATA_LIMIT = 256 << 20  # tensors up to this size travel with their values


def _tensor_spec(t):
    """What the child rebuilds ``t`` from: its values when it has real, small
    data (host code may read them: targets, hash-table sizes), else zeros of
    its shape, strides and dtype."""
    import torch

    if t.device.type != "meta" and t.numel() * t.element_size() <= _DATA_LIMIT:
        if t.dtype.is_floating_point and t.element_size() == 1:  # torch cannot unpickle fp8 tensors
            return ("__bits__", t.detach().cpu().view(torch.uint8), str(t.dtype).replace("torch.", ""))
        return ("__data__", t.detach().cpu())
    return ("__tensor__", tuple(t.shape), tuple(t.stride()), str(t.dtype).replace("torch.", ""),
            t.storage_offset())


def _materialize(a):
    import torch

    if isinstance(a, tuple) and a and a[0] == "__data__":
        return a[1]
    if isinstance(a, tuple) and a and a[0] == "__bits__":
        return a[1].view(getattr(torch, a[2]))
    if isinstance(a, tuple) and a and a[0] == "__tensor__":
        _, shape, stride, dtype, offset = a
        size = 1 + sum((s - 1) * st for s, st in zip(shape, stride) if s > 0) + offset if all(shape) else 0
        base = torch.zeros(max(size, 1), dtype=getattr(torch, dtype))
        return base.as_strided(shape, stride, offset)
    return a


def _child_op(job: dict) -> list[dict]:
    from triton.runtime.jit import JITFunction

    from opforge.runtime.launch import jit_run_only
    from opforge.runtime.registry import get

    op = get(job["op"])
    v = op.variant(job["variant"])
    args = tuple(_materialize(a) for a in job["args"])
    launches = []
    original = JITFunction.run

    def capture(self, *a, grid, warmup, **kw):
        launches.append((self, a, dict(kw)))

    JITFunction.run = capture
    note = ""
    try:
        with jit_run_only():  # pre-bound launchers (runtime/launch.py) would bypass the capture
            v.run(job["config"], *args)
    except Exception as e:
        # host code that reads what an earlier (captured, never run) kernel
        # wrote stops here; the kernels launched so far are still reported
        if not launches:
            raise
        note = (f"host code stopped after {len(launches)} launch(es) "
                f"(it reads kernel output): {type(e).__name__}: {str(e)[:200]}")
    finally:
        JITFunction.run = original
    if not launches:
        raise ProfileError(f"{op.qualname} variant {v.name} launched no Triton kernel")
    out = []
    for fn, a, kw in launches:
        res = _compile_captured(fn, a, kw, job["arch"])
        res["note"] = note
        out.append(res)
    return out


def _child_main() -> None:
    jobs = pickle.loads(sys.stdin.buffer.read())
    results = []
    for job in jobs:
        try:
            if job["kind"] == "op":
                results.append({"launches": _child_op(job)})
            elif job["kind"] == "launch":
                fn = resolve(job["fn"])
                args = tuple(_materialize(a) for a in job["args"])
                kwargs = {k: _materialize(v) for k, v in job["kwargs"].items()}
                results.append(_compile_launch(fn, args, kwargs, job["arch"]))
            else:
                fn = resolve(job["fn"])
                results.append(_compile_local(fn, job["signature"], job["constexprs"], job["num_warps"],
                                              job["num_stages"], job["arch"]))
        except Exception as e:  # reported to the parent, which raises
            results.append({"error": f"{type(e).__name__}: {e}"})
    sys.stdout.write("\n@@OPFORGE@@" + json.dumps(results))
    sys.stdout.flush()


# ---------------------------------------------------------------------------
# public API
# ---------------------------------------------------------------------------
def _resources(name, res, limits, signature, constexprs, arch) -> Resources:
    occ = theoretical_occupancy(res["registers"], res["shared_bytes"], res["num_warps"], limits)
    return Resources(name, res["registers"], res["spill_stores"], res["spill_loads"], res["shared_bytes"],
                     res["num_warps"], res["num_stages"], occ, arch, dict(signature), dict(constexprs),
                     res.get("note", ""))


def compile_resources(fn, signature: dict[str, str], constexprs: dict[str, Any] | None = None, *,
                      num_warps: int = 4, num_stages: int = 3, arch: int = 90,
                      limits: Limits | None = None) -> Resources:
    """Compile ``fn`` (``"module:function"`` or a ``triton.jit`` object) for sm_``arch``
    and report registers, spills, shared memory and theoretical occupancy.

    ``signature`` maps each runtime argument to a Triton type (``"*bf16"``,
    ``"i32"``, ``"fp32"``); ``constexprs`` maps constexpr arguments to values.
    """
    constexprs = dict(constexprs or {})
    ptxas_path()  # fail early and clearly
    name = kernel_name(fn)
    job = {"kind": "fn", "fn": name, "signature": dict(signature), "constexprs": constexprs,
           "num_warps": num_warps, "num_stages": num_stages, "arch": arch}
    (res,) = _in_child([job])
    return _resources(name, res, limits, signature, constexprs, arch)


@contextlib.contextmanager
def _env(key: str, value: str):
    old = os.environ.get(key)
    os.environ[key] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = old


def _cpu_args(args: tuple) -> tuple:
    import torch

    def cpu(a):
        if isinstance(a, torch.Tensor) and a.device.type == "meta":
            return torch.zeros_like(a, device="cpu")
        return a

    return tuple(cpu(a) for a in args)


def decide_for_profile(op_name: str, args: tuple, variant: str | None = None, config: dict | None = None):
    """The dispatch decision ``op_resources`` profiles (see there); CPU/meta args
    decide under the interpreter's rules."""
    import torch

    from opforge.runtime import dispatch
    from opforge.runtime.registry import get

    op = get(op_name)
    try:  # the reference's signature is the op's: name the missing arguments before a check trips on them
        signature = inspect.signature(op.reference)
    except ValueError:  # a builtin (torch.abs) has none
        signature = None
    try:
        if signature is not None:
            signature.bind(*args)
    except TypeError as e:
        params = ", ".join(signature.parameters)
        raise ProfileError(f"{op.qualname} takes ({params}); got {len(args)} argument(s): {e} "
                           f"(on the command line, pass the arguments after the first tensor with --arg)") from None
    args = _cpu_args(args)
    on_cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    ctx = contextlib.nullcontext() if on_cuda else _env("OPFORGE_INTERPRET", "1")
    with ctx:
        if variant is not None:
            # the variant's own checks still apply, except the interpreter's
            # (the kernel is compiled, never interpreted)
            v = op.variant(variant)
            op.validate(*args)
            if v.kind == "triton":
                reason = v.check(*args)
                if reason is not None and "interpreter" not in reason:
                    raise ProfileError(f"{op.qualname}: variant {variant} rejects these arguments: {reason}")
            cfg = config if config is not None else v.default_config(*args)
            decision = dispatch.Decision(op, v, dict(cfg), "forced")
        else:
            decision = dispatch.decide(op, args, tune=False)
            if config is not None:
                decision.config = dict(config)
    if decision.variant.kind != "triton":
        raise ProfileError(f"{op.qualname} runs {decision.variant.name} ({decision.variant.kind}) for these "
                           f"arguments: no Triton kernel to compile; pass variant= to pick a Triton one")
    return decision


def op_resources(op_name: str, *args, arch: int = 90, limits: Limits | None = None,
                 variant: str | None = None, config: dict | None = None):
    """Resources of what opforge would run for ``op_name(*args)``.

    Tensors may be on the CPU or ``meta`` (only shapes, strides and dtypes
    matter). Without CUDA tensors the decision is dispatch's CPU decision under
    the interpreter rules (a variant the interpreter cannot run, such as a
    multi-program split, is rejected there although the GPU would take it);
    ``variant=``/``config=`` override it. Returns ``(decision, [Resources, ...])``,
    one per kernel the variant launches.
    """
    ptxas_path()
    decision = decide_for_profile(op_name, args, variant, config)
    (res,) = op_config_resources(decision, args, [decision.config], arch=arch, limits=limits)
    if isinstance(res, str):
        raise ProfileError(res)
    return decision, res


def op_config_resources(decision, args: tuple, configs: list[dict], *, arch: int = 90,
                        limits: Limits | None = None) -> list:
    """For each config of ``decision``'s variant: its ``[Resources, ...]``, or the
    error text when that config does not compile. One compile child for all."""
    return ops_config_resources([(decision, args, configs)], arch=arch, limits=limits)[0]


def ops_config_resources(items: list, *, arch: int = 90, limits: Limits | None = None, workers: int = 1) -> list:
    """``op_config_resources`` of several ``(decision, args, configs)`` at once, the
    compiles spread over ``workers`` child processes (a child's start, importing
    torch and Triton, costs seconds: many ops are cheaper together)."""
    import torch

    ptxas_path()
    jobs, counts = [], []
    for decision, args, configs in items:
        spec = [_tensor_spec(a) if isinstance(a, torch.Tensor) else a for a in _cpu_args(args)]
        jobs += [{"kind": "op", "op": decision.op.name, "variant": decision.variant.name, "config": dict(cfg),
                  "args": spec, "arch": arch} for cfg in configs]
        counts.append(len(configs))
    flat = []
    for res in _in_child(jobs, raise_errors=False, workers=workers):
        if "error" in res:
            flat.append(res["error"])
        else:
            flat.append([_resources(r["kernel"], r, limits, r["signature"], r["constexprs"], arch)
                         for r in res["launches"]])
    out, start = [], 0
    for n in counts:
        out.append(flat[start:start + n])
        start += n
    return out


def _launch_job(fn, args: tuple, kwargs: dict, arch: int) -> dict:
    import torch

    def spec(a):
        return _tensor_spec(a) if isinstance(a, torch.Tensor) else a

    args = _cpu_args(args)
    kwargs = dict(zip(kwargs, _cpu_args(tuple(kwargs.values()))))
    return {"kind": "launch", "fn": kernel_name(fn), "args": [spec(a) for a in args],
            "kwargs": {k: spec(v) for k, v in kwargs.items()}, "arch": arch}


def kernel_resources(fn, *args, arch: int = 90, limits: Limits | None = None, **kwargs) -> Resources:
    """Resources of the launch ``fn[grid](*args, **kwargs)`` (grid does not matter):
    ``fn`` is a ``triton.jit`` kernel defined at the top level of an importable
    module, or its ``"module:function"`` name; tensors may be on any device
    (``meta`` too); ``num_warps``/``num_stages`` go in ``kwargs`` as at launch.
    Compiled for sm_``arch`` with the JIT's own specialization."""
    ptxas_path()
    job = _launch_job(fn, args, kwargs, arch)
    (res,) = _in_child([job])
    return _resources(job["fn"], res, limits, res["signature"], res["constexprs"], arch)


def launches_resources(launches, *, arch: int = 90, limits: Limits | None = None) -> list:
    """``kernel_resources`` of many ``(fn, args, kwargs)`` launches in one compile
    child: a ``Resources`` or the error text for each."""
    ptxas_path()
    jobs = [_launch_job(fn, a, kw, arch) for fn, a, kw in launches]
    out = []
    for job, res in zip(jobs, _in_child(jobs, raise_errors=False) if jobs else []):
        out.append(res["error"] if "error" in res else
                   _resources(job["fn"], res, limits, res["signature"], res["constexprs"], arch))
    return out


_TORCH_TO_TRITON: dict = {}


def _torch_to_triton() -> dict:
    """torch dtype -> Triton signature type, filled on first use (importing this module, and so
    the `opforge` command that lists `profile`'s arguments, must not import torch)."""
    if _TORCH_TO_TRITON:
        return _TORCH_TO_TRITON
    import torch

    _TORCH_TO_TRITON.update({
        torch.bool: "i1", torch.int8: "i8", torch.int16: "i16", torch.int32: "i32", torch.int64: "i64",
        torch.uint8: "u8", torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32",
        torch.float64: "fp64",
    })
    for name, t in (("float8_e4m3fn", "fp8e4nv"), ("float8_e5m2", "fp8e5")):
        if hasattr(torch, name):
            _TORCH_TO_TRITON[getattr(torch, name)] = t
    return _TORCH_TO_TRITON

if __name__ == "__main__":
    _child_main()
