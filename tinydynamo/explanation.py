"""``tinydynamo.explain(fn)(*args)``: what tinydynamo did with a call, like ``torch._dynamo.explain``.

Runs ``fn`` once under tinydynamo (with a fresh cache, so every frame on the path is compiled)
and reports the graphs, the graph breaks with their reasons and the user's source lines, op
counts and guards.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Callable

import torch.fx

from tinydynamo import artifacts, convert_frame, eval_frame
from tinydynamo.guards import Guard
from tinydynamo.output_graph import CALL_OPS


@dataclasses.dataclass
class BreakReason:
    reason: str
    user_stack: list[str]  # 'File "...", line N, in fn\n  source', innermost first

    def __str__(self) -> str:
        frames = "\n".join(reversed(self.user_stack)) or "<unknown>"  # outermost first, like a traceback
        return f"{self.reason}\n    {frames.replace(chr(10), chr(10) + '    ')}"


@dataclasses.dataclass
class ExplainOutput:
    graphs: list[torch.fx.GraphModule]
    graph_count: int
    graph_break_count: int
    break_reasons: list[BreakReason]
    op_count: int
    ops_per_graph: list[list[Any]]
    out_guards: list[Guard]
    eager_frames: list[tuple[str, str]] = dataclasses.field(default_factory=list)  # (frame, why) run eagerly
    #: inside a DDP forward: how each graph was split at DDP's buckets (``graphs`` then holds the pieces)
    ddp_splits: list[str] = dataclasses.field(default_factory=list)

    def __str__(self) -> str:
        lines = [f"Graph Count: {self.graph_count}", f"Graph Break Count: {self.graph_break_count}",
                 f"Op Count: {self.op_count}", "Break Reasons:"]
        for i, br in enumerate(self.break_reasons, 1):
            lines.append(f"  Break Reason {i}:\n    Reason: {br}")
        lines.append("Ops per Graph:")
        for i, ops in enumerate(self.ops_per_graph, 1):
            lines.append(f"  Ops {i}:")
            lines += [f"    {getattr(op, '__name__', op)}" for op in ops]
        lines.append("Out Guards:")
        lines += [f"  {g}" for g in self.out_guards]
        if self.eager_frames:
            lines.append("Frames run eagerly (not resumable):")
            lines += [f"  {name}: {why}" for name, why in self.eager_frames]
        for split in self.ddp_splits:
            lines.append(split)
        return "\n".join(lines)


def explain(fn: Callable, *extra_args, **extra_kwargs) -> Callable[..., ExplainOutput]:
    """``explain(fn)(*args, **kwargs) -> ExplainOutput`` (calls ``fn`` once, for real)."""

    def inner(*args, **kwargs) -> ExplainOutput:
        graphs: list[torch.fx.GraphModule] = []
        breaks: list[BreakReason] = []
        guards: list[Guard] = []

        def backend(gm, example_inputs):
            graphs.append(gm)
            return gm.forward

        eager: list[tuple[str, str]] = []

        def listen(event, data):
            if event == "break":
                breaks.append(BreakReason(data.reason, list(data.error.user_stack)))
            elif event == "eager":
                eager.append(data)
            else:
                guards.extend(data.check_fn.guards)

        eval_frame.reset()
        convert_frame._listeners.append(listen)
        kept = list(artifacts.history)  # keeps them alive, so their ids stay unique
        before = {id(a) for a in kept}
        try:
            eval_frame.optimize(backend)(fn)(*args, **kwargs)
        finally:
            convert_frame._listeners.remove(listen)
            eval_frame.reset()
        ops = [[n.target for n in gm.graph.nodes if n.op in CALL_OPS] for gm in graphs]
        splits = [str(v) for a in artifacts.history if id(a) not in before for _, v in a.get("ddp_split")]
        return ExplainOutput(graphs, len(graphs), len(breaks), breaks, sum(map(len, ops)), ops, guards, eager,
                             splits)

    if extra_args or extra_kwargs:
        return inner(*extra_args, **extra_kwargs)
    return inner
