"""End-to-end check on a GPU: the course models through tinydynamo + tininductor (Triton on CUDA) vs eager.

Inference of the seeds' block in fp32 and fp16 (kernels listed), then a few SGD steps of the
block and of the small GPT, with every loss compared with eager's. Exits non-zero on a mismatch.

    python bench/gpu_e2e.py
"""
from __future__ import annotations

import copy
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import torch  # noqa: E402

import tinydynamo  # noqa: E402
from course.models import GPT, TinyBlock  # noqa: E402
from tinydynamo import artifacts  # noqa: E402


def main() -> int:
    if not torch.cuda.is_available():
        print("no CUDA device: nothing to check")
        return 0
    device = "cuda"
    torch.manual_seed(0)
    for dtype, tol in ((torch.float32, 1e-3), (torch.float16, 1e-2)):
        model = TinyBlock(768).to(device, dtype).eval()
        x = torch.randn(32, 128, 768, device=device, dtype=dtype)
        compiled = tinydynamo.compile(model)
        with torch.no_grad():
            start = time.perf_counter()
            out = compiled(x)
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            torch.testing.assert_close(out, model(x), rtol=tol, atol=tol)
        kernels = [title for title, _ in artifacts.history[-1].get("kernels")]
        print(f"block inference {dtype}: equals eager; first call {first:.2f}s; kernels {kernels}")
    cases = (
        ("TinyBlock", lambda: TinyBlock(256), lambda: (torch.randn(8, 64, 256, device=device),)),
        ("GPT", lambda: GPT(vocab_size=128, block_size=32, n_layer=2, n_head=4, n_embd=64),
         lambda: (torch.randint(0, 128, (4, 32), device=device),) * 2),
    )
    for name, make, make_inputs in cases:
        torch.manual_seed(0)
        model = make().to(device)
        reference = copy.deepcopy(model)
        compiled = tinydynamo.compile(model)
        optimizers = [torch.optim.SGD(m.parameters(), lr=0.05) for m in (model, reference)]
        inputs = make_inputs()
        for step in range(4):
            losses = []
            for fn in (compiled, reference):
                out = fn(*inputs)
                losses.append(out[1] if isinstance(out, tuple) else out.square().mean())
                losses[-1].backward()
            for opt in optimizers:
                opt.step()
                opt.zero_grad()
            print(f"{name} step {step}: tiny loss {losses[0].item():.6f}  eager loss {losses[1].item():.6f}")
            torch.testing.assert_close(losses[0], losses[1], rtol=1e-4, atol=1e-4)
        print(f"{name} trains like eager; frames {dict(tinydynamo.counters['frames'])}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
