"""Chapter 5: FX graphs and decompositions.

Five pieces of tininductor's front half: read a graph (5.1), run one node by node (5.2), and
write the decompositions that turn three real-model ops into the prim set (5.3 - 5.5). The
graded tests plug each decomposition into ``tininductor.decompositions.decompose`` in place of
the package's own and compare the decomposed graph with eager PyTorch.

Write decompositions with ``aten.*`` prims only (see ``tininductor.prims``): ``aten.mul``,
``aten.add``, ``aten.exp``, ``aten.amax``, ``aten.sum``, ``aten.mean``, ``aten.var``, ...
"""
from __future__ import annotations

import collections
import math

import torch
import torch.fx as fx

aten = torch.ops.aten


def count_ops(gm: fx.GraphModule) -> dict[str, int]:
    """How often each op is called in ``gm``: ``{str(node.target): count}`` over call_function nodes."""
    # BEGIN SOLUTION (Exercise 5.1: how often each op is called in the graph; checked on decomposed graphs (notebook 05, section 2))
    return dict(collections.Counter(str(n.target) for n in gm.graph.nodes if n.op == "call_function"))
    # END SOLUTION


def interpret(gm: fx.GraphModule, *args):
    """Run ``gm``'s graph node by node, as ``torch.fx.Interpreter`` does, and return its output.

    ``placeholder`` nodes take the arguments in order, ``get_attr`` nodes read an attribute of
    ``gm``, ``call_function`` nodes call ``node.target`` on their (looked-up) arguments, and the
    ``output`` node's argument (a value, tuple or list of nodes) is the result.
    """
    # BEGIN SOLUTION (Exercise 5.2: run the graph node by node and return its output; checked on decomposed modules and on graphs with lists, keywords and nested outputs (notebook 05, section 2))
    env: dict[fx.Node, object] = {}
    inputs = iter(args)

    def load(a):
        return fx.node.map_arg(a, lambda n: env[n])

    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(inputs)
        elif node.op == "get_attr":
            env[node] = getattr(gm, node.target)
        elif node.op == "call_function":
            env[node] = node.target(*load(node.args), **load(node.kwargs))
        elif node.op == "output":
            return load(node.args[0])
        else:
            raise NotImplementedError(f"node kind {node.op} ({node.name})")
    # END SOLUTION


def gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """GELU in prims: ``x/2 * (1 + erf(x/sqrt 2))``, or with ``approximate="tanh"``
    ``x/2 * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3)))``."""
    # BEGIN SOLUTION (Exercise 5.3: GELU in prims, both forms; checked for prims only and against eager in float32 and float64 (notebook 05, section 5))
    if approximate == "tanh":
        cube = aten.mul(aten.mul(x, x), x)
        inner = aten.mul(aten.add(x, aten.mul(cube, 0.044715)), math.sqrt(2 / math.pi))
        return aten.mul(aten.mul(x, 0.5), aten.add(aten.tanh(inner), 1))
    return aten.mul(aten.mul(x, 0.5), aten.add(aten.erf(aten.mul(x, 1 / math.sqrt(2))), 1))
    # END SOLUTION


def native_layer_norm(x, normalized_shape, weight, bias, eps):
    """LayerNorm over the last ``len(normalized_shape)`` dims; returns ``(out, mean, rstd)``.

    ``mean`` and ``rstd = 1/sqrt(var + eps)`` keep the reduced dims (size 1), the variance is
    the biased one (``correction=0``), and ``weight``/``bias`` may be ``None``.
    """
    # BEGIN SOLUTION (Exercise 5.4: LayerNorm's three results in prims; checked against aten.native_layer_norm and inside the block (notebook 05, section 5))
    dims = list(range(x.dim() - len(normalized_shape), x.dim()))
    mean = aten.mean(x, dims, keepdim=True)
    rstd = aten.rsqrt(aten.add(aten.var(x, dims, correction=0, keepdim=True), eps))
    out = aten.mul(aten.sub(x, mean), rstd)
    if weight is not None:
        out = aten.mul(out, weight)
    if bias is not None:
        out = aten.add(out, bias)
    return out, mean, rstd
    # END SOLUTION


def softmax(x: torch.Tensor, dim: int, half_to_float: bool = False) -> torch.Tensor:
    """Softmax along ``dim`` in prims, numerically stable: subtract the max before ``exp``."""
    # BEGIN SOLUTION (Exercise 5.5: softmax in prims, stable for large inputs; checked along every dim and near +-1000 (notebook 05, section 5))
    e = aten.exp(aten.sub(x, aten.amax(x, [dim], True)))
    return aten.div(e, aten.sum(e, [dim], True))
    # END SOLUTION
