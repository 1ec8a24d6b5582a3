"""The wrapper's header: torch's C++ allocators and views, or the same in Python where torch lacks them."""
import builtins

import torch

from tininductor.codegen.wrapper import HEADER, allocation
from tininductor.ir import Layout


def header_namespace(monkeypatch, with_fast_paths: bool) -> dict:
    if not with_fast_paths:
        real_import = builtins.__import__

        def import_without_guards(name, *args, **kwargs):
            if name == "torch._C._dynamo.guards":
                raise ImportError(name)
            return real_import(name, *args, **kwargs)

        monkeypatch.setattr(builtins, "__import__", import_without_guards)
    namespace: dict = {}
    try:
        exec(HEADER, namespace)
    finally:
        monkeypatch.undo()
    return namespace


def test_python_fallbacks_do_what_the_fast_paths_do(monkeypatch):
    fast, slow = header_namespace(monkeypatch, True), header_namespace(monkeypatch, False)
    assert fast["reinterpret_tensor"] is torch._C._dynamo.guards._reinterpret_tensor
    assert slow["reinterpret_tensor"] is not fast["reinterpret_tensor"]
    base = torch.arange(100.0)[10:]  # a view with a storage offset: offsets are relative to it
    views = [ns["reinterpret_tensor"](base, (3, 4), (1, 3), 5) for ns in (fast, slow)]
    assert views[0].storage_offset() == views[1].storage_offset() == 15
    torch.testing.assert_close(views[0], views[1])
    buffers = [ns["empty_strided_cpu"]((2, 3), (1, 2), torch.float16) for ns in (fast, slow)]
    for b in buffers:
        assert (b.shape, b.stride(), b.dtype, b.device.type) == ((2, 3), (1, 2), torch.float16, "cpu")


def test_allocation_source_names_the_device_kind():
    cpu = Layout(torch.device("cpu"), torch.float32, [4, 8], [8, 1], 0)
    assert allocation(cpu) == "empty_strided_cpu((4, 8), (8, 1), torch.float32)"
    cuda = Layout(torch.device("cuda", 0), torch.bfloat16, [4], [1], 0)
    assert allocation(cuda) == "empty_strided_cuda((4,), (1,), torch.bfloat16)"
    meta = Layout(torch.device("meta"), torch.float32, [2], [1], 0)
    assert allocation(meta) == "torch.empty_strided((2,), (1,), device='meta', dtype=torch.float32)"


def test_kernels_with_the_same_code_are_generated_once():
    """Repeated layers give kernels that differ only in their names and comments: the wrapper
    emits (and compiles) the first and calls it again for the others, as TorchInductor does;
    kernels whose code differs (here a constant) stay apart. Results equal eager."""
    import re

    from tininductor.testing import DEVICE, check

    def layers(x, w1, w2):
        a = torch.nn.functional.gelu(x @ w1) * 2
        b = torch.nn.functional.gelu(a @ w2) * 2   # the same pointwise kernel as a's
        return torch.nn.functional.gelu(b @ w1) * 3  # a different constant: another kernel

    x, w1, w2 = (torch.randn(8, 8, device=DEVICE) for _ in range(3))
    compiled = check(layers, x, w1, w2, atol=1e-5, rtol=1e-5)
    calls = [m.group(1) for m in re.finditer(r"^\s+(\w+)(?:\.run)?\((?!.*=)", compiled.source, re.MULTILINE)
             if m.group(1) in compiled.kernels]
    assert len(compiled.kernels) == 2, compiled.source
    assert len(calls) == 3 and calls[0] == calls[1] != calls[2], calls
