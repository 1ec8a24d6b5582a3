"""Test helpers shaped like torch._dynamo.testing: count frames and ops a backend receives."""
from __future__ import annotations

from typing import Callable

import torch.fx

from tinydynamo.backends import lookup_backend
from tinydynamo.output_graph import CALL_OPS


class CompileCounter:
    """A backend that counts compiled frames and their ops, then runs the graph as is."""

    def __init__(self):
        self.frame_count = 0
        self.op_count = 0
        self.graphs: list[torch.fx.GraphModule] = []

    def __call__(self, gm: torch.fx.GraphModule, example_inputs: list) -> Callable:
        self.frame_count += 1
        self.op_count += sum(1 for n in gm.graph.nodes if n.op in CALL_OPS)
        self.graphs.append(gm)
        return gm.forward

    def clear(self) -> None:
        self.frame_count = self.op_count = 0
        self.graphs.clear()


class CompileCounterWithBackend(CompileCounter):
    """Counts like CompileCounter, then compiles with a real backend."""

    def __init__(self, backend):
        super().__init__()

        self.backend = lookup_backend(backend)

    def __call__(self, gm, example_inputs):
        super().__call__(gm, example_inputs)
        return self.backend(gm, example_inputs)
