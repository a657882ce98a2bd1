"""``runtime.launch``: the signature key, the direct call of a compiled kernel,
and every fallback to ``JITFunction.run``. CPU: a stand-in JITFunction with
the attributes triton 3.6's has (``device_caches`` binder, ``params``,
``pre_run_hooks``, ``run`` returning the CompiledKernel); the real thing is
checked on CUDA in ``tests/gpu/test_fast_path_gpu.py``."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from opforge.runtime import launch


def test_signature_keys_what_triton_specializes():
    x = torch.zeros(64)
    key = launch.signature((x, 16, 1, 2.5, None))
    assert key == (torch.float32, True, 16, 1, float, None)
    assert launch.signature((x[1:],))[1] is False  # 4 bytes past a 16-byte boundary
    assert launch.signature((x.double(),))[0] is torch.float64
    assert launch.signature((x, 3)) != launch.signature((x, 4))  # ints by value: ==1, %16, width
    assert launch.signature((x, 2.5)) == launch.signature((x, -7.0))  # floats are not specialized
    assert launch.signature((torch.nn.Parameter(x),)) == launch.signature((x,))


@pytest.mark.parametrize("odd", [True, object(), "s", (1, 2)])
def test_signature_is_none_for_anything_else(odd):
    assert launch.signature((torch.zeros(4), odd)) is None


class FakeCompiled:
    def __init__(self):
        self.calls = []
        self.function = "cufunction"
        self.packed_metadata = ("meta",)

    @property
    def run(self):
        return lambda *a: self.calls.append(a)


class FakeJIT:
    """Parameters (x_ptr, n, BLOCK: constexpr, FLAG: constexpr=True)."""

    def __init__(self, binder_copies=False):
        self.compiled = FakeCompiled()
        self.slow_calls = []
        self.pre_run_hooks = []
        self.params = [SimpleNamespace(name=n, is_constexpr=c) for n, c in
                       (("x_ptr", False), ("n", False), ("BLOCK", True), ("FLAG", True))]

        def binder(x_ptr, n, BLOCK, FLAG=True, **options):
            if binder_copies:
                x_ptr = x_ptr.clone()
            return {"x_ptr": x_ptr, "n": n, "BLOCK": BLOCK, "FLAG": FLAG}, [], options

        self.device_caches = {0: ({}, {}, None, None, binder)}

    def run(self, *args, grid, warmup, **kw):
        self.slow_calls.append((grid, args, kw))
        return self.compiled

    def __getitem__(self, grid):  # as JITFunction's
        return lambda *args, **kw: self.run(*args, grid=grid, warmup=False, **kw)


@pytest.fixture
def on_device(monkeypatch):
    monkeypatch.setattr(launch, "_current_device", lambda: 0)
    monkeypatch.setattr(launch, "_current_stream", lambda dev: 1234)


def test_first_call_compiles_then_calls_the_compiled_kernel(on_device):
    fn = FakeJIT()
    go = launch.Launcher(fn, BLOCK=128, num_warps=4)
    x = torch.zeros(64)
    go((3,), x, 64)
    assert len(fn.slow_calls) == 1 and fn.slow_calls[0][2] == {"BLOCK": 128, "num_warps": 4}
    go((3,), x, 64)
    go((5, 2), x, 64)
    assert len(fn.slow_calls) == 1
    # grid, stream, function, metadata, no launch metadata / hooks, then every argument in order
    assert fn.compiled.calls == [(3, 1, 1, 1234, "cufunction", ("meta",), None, None, None, x, 64, 128, True),
                                 (5, 2, 1, 1234, "cufunction", ("meta",), None, None, None, x, 64, 128, True)]


def test_a_new_signature_goes_through_jit_run(on_device):
    fn = FakeJIT()
    go = launch.Launcher(fn, BLOCK=128)
    x = torch.zeros(64)
    go((1,), x, 64)
    go((1,), x[1:], 63)  # misaligned and another int: a new signature
    go((1,), x.double(), 64)  # another dtype
    assert len(fn.slow_calls) == 3 and fn.compiled.calls == []
    go((1,), x[1:], 63)
    assert len(fn.slow_calls) == 3 and len(fn.compiled.calls) == 1


def test_hooks_send_every_call_through_jit_run(on_device):
    fn = FakeJIT()
    go = launch.Launcher(fn, BLOCK=128)
    x = torch.zeros(64)
    go((1,), x, 64)
    from triton import knobs

    hook = lambda metadata: None  # noqa: E731
    knobs.runtime.launch_enter_hook.add(hook)
    try:
        go((1,), x, 64)
    finally:
        knobs.runtime.launch_enter_hook.remove(hook)
    fn.pre_run_hooks.append(hook)
    go((1,), x, 64)
    fn.pre_run_hooks.clear()
    assert len(fn.slow_calls) == 3 and fn.compiled.calls == []
    go((1,), x, 64)
    assert len(fn.compiled.calls) == 1


def test_an_unexpected_triton_turns_the_direct_path_off(on_device):
    fn = FakeJIT(binder_copies=True)  # bound arguments that are not the ones passed
    go = launch.Launcher(fn, BLOCK=128)
    x = torch.zeros(64)
    for _ in range(3):
        go((1,), x, 64)
    assert len(fn.slow_calls) == 3 and fn.compiled.calls == [] and not go.direct


def test_a_runtime_parameter_passed_by_name_is_never_called_directly(on_device):
    fn = FakeJIT()
    go = launch.Launcher(fn, n=64, BLOCK=128)  # n is not a constexpr: its value is not in the key
    x = torch.zeros(64)
    go((1,), x)
    go((1,), x)
    assert len(fn.slow_calls) == 2 and fn.compiled.calls == []


def test_odd_arguments_go_through_jit_run(on_device):
    fn = FakeJIT()
    go = launch.Launcher(fn, BLOCK=128)
    x = torch.zeros(64)
    go((1,), x, True)
    go((1,), x, True)
    assert len(fn.slow_calls) == 2 and fn.compiled.calls == []


def test_the_interpreter_is_called_as_before():
    calls = []

    class Interpreted:
        def __getitem__(self, grid):
            return lambda *a, **kw: calls.append((grid, a, kw))

    go = launch.Launcher(Interpreted(), BLOCK=8)
    go((2,), 1, 2)
    launch.launch(Interpreted(), (3,), 4, BLOCK=16)
    assert calls == [((2,), (1, 2), {"BLOCK": 8}), ((3,), (4,), {"BLOCK": 16})]
    assert not go.direct


def test_launch_keeps_one_launcher_per_kernel_and_options(on_device):
    fn = FakeJIT()
    x = torch.zeros(64)
    for block in (128, 128, 256, 128):
        launch.launch(fn, (1,), x, 64, BLOCK=block)
    assert len(fn.slow_calls) == 2  # one compile per option set; the repeats call directly
    assert [c[-2] for c in fn.compiled.calls] == [128, 128]


def test_an_unhashable_option_launches_through_jit_run(on_device):
    fn = FakeJIT()
    x = torch.zeros(64)
    launch.launch(fn, (1,), x, 64, BLOCK=[128])
    launch.launch(fn, (1,), x, 64, BLOCK=[128])
    assert len(fn.slow_calls) == 2 and fn.compiled.calls == []


def test_jit_run_only_turns_the_direct_call_off(on_device):
    fn = FakeJIT()
    go = launch.Launcher(fn, BLOCK=128)
    x = torch.zeros(64)
    go((1,), x, 64)
    with launch.jit_run_only():
        go((1,), x, 64)
    assert len(fn.slow_calls) == 2 and fn.compiled.calls == []
    go((1,), x, 64)
    assert len(fn.compiled.calls) == 1


def test_a_prepared_launch_keys_on_its_tensors_and_appends_the_fixed_scalars(on_device):
    fn = FakeJIT()
    go = launch.prepare(fn, (3, 2), (64,), BLOCK=128)
    x = torch.zeros(64)
    go(x)  # compiles through JITFunction.run
    go(x)
    go(x)
    assert [c[1] for c in fn.slow_calls] == [(x, 64)] and fn.slow_calls[0][0] == (3, 2)
    assert fn.compiled.calls == [(3, 2, 1, 1234, "cufunction", ("meta",), None, None, None, x, 64, 128, True)] * 2
    go(x[1:])  # misaligned: a new key, through JITFunction.run once
    go(x[1:])
    assert len(fn.slow_calls) == 2 and len(fn.compiled.calls) == 3
    with launch.jit_run_only():
        go(x)
    assert len(fn.slow_calls) == 3


def test_a_prepared_launch_with_odd_fixed_arguments_always_goes_through_jit_run(on_device):
    fn = FakeJIT()
    go = launch.prepare(fn, (1,), (True,), BLOCK=128)
    x = torch.zeros(64)
    for _ in range(3):
        go(x)
    assert len(fn.slow_calls) == 3 and fn.compiled.calls == []


def _cuda_launcher(global_scratch: int):
    """triton 3.6's CudaLauncher without its compiled module: ``launch`` records its arguments."""
    from triton.backends.nvidia.driver import CudaLauncher

    launcher = object.__new__(CudaLauncher)
    launcher.calls = []
    launcher.launch = lambda *a: launcher.calls.append(a)
    launcher.num_ctas, launcher.global_scratch_size, launcher.global_scratch_align = 1, global_scratch, 16
    launcher.profile_scratch_size, launcher.profile_scratch_align = 0, 1
    launcher.launch_cooperative_grid, launcher.launch_pdl = False, True
    return launcher


@pytest.mark.parametrize("scratch", [0, 128])
def test_the_direct_call_passes_what_the_cuda_launcher_would(scratch, on_device, monkeypatch):
    """With no scratch to allocate, the C launch is called as ``CudaLauncher.__call__`` calls it;
    a kernel that needs scratch (device-side TMA descriptors) keeps ``__call__``."""
    from triton.runtime import _allocation

    fn = FakeJIT()
    launcher = _cuda_launcher(scratch)
    fn.compiled = SimpleNamespace(run=launcher, function="cufunction", packed_metadata=("meta",))
    token = _allocation._allocator.set(lambda size, align, stream: SimpleNamespace(size=size))
    try:
        x = torch.zeros(64)
        go = launch.Launcher(fn, BLOCK=128)
        go((3, 2), x, 64)  # through JITFunction.run (the fake records nothing there)
        go((3, 2), x, 64)
        launcher.__call__(3, 2, 1, 1234, "cufunction", ("meta",), None, None, None, x, 64, 128, True)
    finally:
        _allocation._allocator.reset(token)
    direct, expected = launcher.calls
    assert len(fn.slow_calls) == 1
    if scratch:  # a fresh scratch buffer a launch: compare all but that
        assert direct[7].size == expected[7].size == 6 * 128
        direct, expected = direct[:7] + direct[8:], expected[:7] + expected[8:]
    assert direct == expected
