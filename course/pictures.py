"""Diagrams for the notebooks, as Graphviz DOT (rendered to SVG in Jupyter when ``dot`` is installed).

* :func:`partition_dot`: what a partitioner does with a joint graph (chapter 6): which values the
  forward saves, which ops the backward recomputes, which run in the forward only.
* :func:`cudagraph_dot`: what ``mode="reduce-overhead"`` changes (chapter 11): a launch per
  kernel on every call, versus recording the launches once and replaying them with one call.
"""
from __future__ import annotations

import graphviz

_NODE = {"shape": "box", "style": "filled,rounded", "fontsize": "8", "height": "0.18",
         "margin": "0.03,0.01", "penwidth": "0.5", "fontname": "Helvetica"}
COLOURS = {"input": "#9fd49f", "saved": "#ffd54f", "recomputed": "#ce93d8", "forward": "#8fb8e8",
           "backward": "#f5b971"}


def partition_dot(joint, partition, title: str) -> graphviz.Digraph:
    """The forward side of ``joint`` (a ``tininductor.joint_graph.JointGraph``) coloured by what
    ``partition`` does with each value; everything that depends on a tangent is one box."""
    saved = set(partition.saved)
    in_bw = {n.name for n in partition.bw_gm.graph.nodes}
    backward: set[str] = set()
    for node in joint.gm.graph.nodes:  # program order: a node's inputs are classified before it
        if node.op != "output" and (node.name.startswith("tangents")
                                    or any(a.name in backward for a in node.all_input_nodes)):
            backward.add(node.name)
    dot = graphviz.Digraph(graph_attr={"rankdir": "LR", "label": title, "labelloc": "t", "fontsize": "10",
                                       "nodesep": "0.06", "ranksep": "0.2", "fontname": "Helvetica"},
                           node_attr=_NODE, edge_attr={"arrowsize": "0.4", "color": "#999999"})
    with dot.subgraph(name="cluster_legend", graph_attr={"label": "", "style": "invis"}) as legend:
        for kind, text in (("input", "input"), ("saved", "saved for the backward"),
                           ("recomputed", "recomputed in the backward"), ("forward", "forward only")):
            legend.node(f"legend_{kind}", text, fillcolor=COLOURS[kind], fontsize="7")
    dot.node("backward", f"backward\n({len(backward)} ops)", fillcolor=COLOURS["backward"])
    feeds_backward: set[str] = set()
    for node in joint.gm.graph.nodes:
        if node.op == "output" or node.name in backward:
            continue
        kind = ("saved" if node.name in saved else "input" if node.op == "placeholder"
                else "recomputed" if node.name in in_bw else "forward")
        label = node.name if node.op == "placeholder" else str(getattr(node.target, "__name__", node.target)).split(".")[0]
        dot.node(node.name, label, fillcolor=COLOURS[kind], penwidth="1.5" if kind == "saved" else "0.5")
        for arg in node.all_input_nodes:
            dot.edge(arg.name, node.name)
        if kind in ("saved", "recomputed") and any(u.name in backward for u in node.users):
            feeds_backward.add(node.name)
            dot.edge(node.name, "backward", color="#d32f2f" if kind == "saved" else COLOURS["recomputed"])
    return dot


def cudagraph_dot(kernels: list[str], title: str = "") -> graphviz.Digraph:
    """Eager-style launching versus a CUDA graph, for a graph whose kernels are ``kernels``."""
    dot = graphviz.Digraph(graph_attr={"rankdir": "LR", "label": title, "labelloc": "t", "fontsize": "10",
                                       "nodesep": "0.1", "ranksep": "0.25", "fontname": "Helvetica", "newrank": "true"},
                           node_attr=_NODE, edge_attr={"arrowsize": "0.4", "color": "#777777"})
    host, device, record = "#8fb8e8", "#f5b971", "#ffd54f"

    def row(name: str, label: str, steps: list[tuple[str, str, str]]) -> None:
        with dot.subgraph(name=f"cluster_{name}", graph_attr={"label": label, "fontsize": "9", "style": "rounded",
                                                             "color": "#bbbbbb", "labeljust": "l"}) as sub:
            previous = None
            for key, text, colour in steps:
                sub.node(f"{name}_{key}", text, fillcolor=colour)
                if previous:
                    sub.edge(previous, f"{name}_{key}")
                previous = f"{name}_{key}"

    row("record", "reduce-overhead, first call: warm up, then record the launches once",
        [("guard", "guards", host), ("copy", "inputs → static buffers", host), ("warm", "warm-up run", host),
         ("begin", "begin capture", record)]
        + [(f"k{i}", k, record) for i, k in enumerate(kernels)]
        + [("end", "graph + static outputs", record)])
    row("replay", "reduce-overhead, every later call: one replay issues them all",
        [("guard", "guards", host), ("copy", "inputs → static buffers", host), ("replay", "graph.replay()", host)]
        + [(f"k{i}", k, device) for i, k in enumerate(kernels)]
        + [("out", "static outputs (overwritten next call)", host)])
    row("default", "default mode, every call: the host issues each launch",
        [("guard", "guards", host)]
        + [step for i, k in enumerate(kernels) for step in ((f"l{i}", "launch", host), (f"k{i}", k, device))]
        + [("out", "fresh outputs", host)])
    dot.edge("record_end", "replay_replay", style="dashed", constraint="false", label="reused",
             fontsize="7", fontname="Helvetica")
    return dot
