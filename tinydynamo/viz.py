"""Draw an FX graph with graphviz: placeholders, ops and the output, edges along data flow.

``draw(gm)`` returns a ``graphviz.Digraph`` (Jupyter renders it as SVG when the ``dot`` binary is
installed); ``to_dot(gm)`` gives the DOT text, which needs nothing installed.
"""
from __future__ import annotations

import shutil

import torch.fx

_STYLE = {
    "placeholder": dict(shape="box", style="filled", fillcolor="#dbeafe"),
    "get_attr": dict(shape="box", style="filled", fillcolor="#e0e7ff"),
    "output": dict(shape="box", style="filled", fillcolor="#dcfce7"),
}


def _label(node: torch.fx.Node) -> str:
    if node.op in ("call_function", "call_method", "call_module"):
        target = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", str(node.target))
        label = f"{node.name}\\n{target}"
    else:
        label = node.meta.get("source", node.name)
    ex = node.meta.get("example_value")
    if hasattr(ex, "shape"):
        label += f"\\n{list(ex.shape)} {str(ex.dtype).replace('torch.', '')}"
    return label.replace('"', "'")


def to_dot(gm: torch.fx.GraphModule | torch.fx.Graph, name: str = "graph") -> str:
    graph = gm.graph if isinstance(gm, torch.fx.GraphModule) else gm
    lines = [f'digraph "{name}" {{', "  rankdir=TB; node [fontname=Helvetica, fontsize=10, shape=ellipse];"]
    for node in graph.nodes:
        style = ", ".join(f'{k}="{v}"' for k, v in _STYLE.get(node.op, {}).items())
        lines.append(f'  "{node.name}" [label="{_label(node)}"{", " + style if style else ""}];')
        for inp in node.all_input_nodes:
            lines.append(f'  "{inp.name}" -> "{node.name}";')
    lines.append("}")
    return "\n".join(lines)


def can_render() -> bool:
    return shutil.which("dot") is not None


def draw(gm: torch.fx.GraphModule | torch.fx.Graph, name: str = "graph"):
    """A ``graphviz.Source`` of the graph (renders as SVG in Jupyter when ``dot`` is installed)."""
    import graphviz  # optional: only drawing needs it

    return graphviz.Source(to_dot(gm, name))
