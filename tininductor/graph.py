"""GraphLowering: run a prim-level FX graph with lowerings instead of kernels, producing IR.

It is a ``torch.fx.Interpreter`` whose values are IR nodes: placeholders become
``InputBuffer``s, each ``call_function`` calls the op's lowering (or builds a fallback
``ExternKernel`` when there is none, logging the reason), and the outputs are realized.
Realized buffers are collected in ``self.buffers`` in program order for the scheduler.

Dynamic shapes: a graph whose example inputs carry symbolic sizes (SymInt placeholders, fake
tensors whose sizes are ShapeEnv symbols) lowers with sizes that are sympy expressions over
those symbols (``indexing.size_expr``). Every FX node whose value is a ``SymInt`` (a SymInt
placeholder, ``sym_size``, size arithmetic) becomes its ShapeEnv expression. ``size_sources``
says where the wrapper reads each symbol from at run time (an int argument, or an input
tensor's size), so kernels and allocations can take sizes as plain Python ints.
"""
from __future__ import annotations

import contextlib
import logging
import operator
from typing import Any, Callable

import sympy
import torch
from torch._dispatch.python import enable_python_dispatcher
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._pytree import tree_flatten, tree_map

from . import config, ir
from .indexing import ModularIndexing, size_expr, sym
from .lowering import EXTERN_OPS, KERNEL_DTYPES, LoweringDeclined, lookup
from .runtime.conv_weights import channels_last_weight
from .scheduler import ReadWrites
from .virtualized import V

log = logging.getLogger("tininductor.lowering")


def op_name(target) -> str:
    """Short readable name of an FX target: ``aten.add.Tensor`` -> ``add``."""
    name = getattr(target, "__name__", str(target))
    return name.split(".")[0].lstrip("_") or "op"


def _scalar_destination(node: torch.fx.Node) -> torch.device | None:
    """Where a 0-dim CPU constant may live instead: the one device of every op its value reaches
    (through other 0-dim CPU values: an alias, a copy), or None where it reaches the graph's output
    or a CPU op.

    ``ids[:, 0] = 2`` lifts the 2 as such a constant, and eager reads it as a number on the host
    whatever the device of the op. Kept on the CPU, it would make a CUDA graph a graph of two devices
    (its alias is a CPU buffer), which runs without CUDA graphs; moved to the device once, at
    compile time, it is read there. TorchInductor moves CPU tensor constructors whose users are all
    on CUDA to CUDA for the same reason (its ``move_constructors_to_cuda`` pass).
    """
    devices: set[torch.device] = set()
    todo = list(node.users)
    while todo:
        user = todo.pop()
        value = user.meta.get("val")
        if user.op != "call_function" or not isinstance(value, torch.Tensor):
            return None
        if value.device.type != "cpu":
            devices.add(value.device)
        elif value.dim() == 0:
            todo.extend(user.users)
        else:
            return None
    return devices.pop() if len(devices) == 1 else None


def _leaves(value) -> list:
    """The leaves of nested tuples, lists and dicts (pytree's ``tree_flatten`` without the spec:
    asked for every node lowered, where pytree's generality costs a tenth of the lowering)."""
    if isinstance(value, (tuple, list)):
        return [leaf for v in value for leaf in _leaves(v)]
    if isinstance(value, dict):
        return [leaf for v in value.values() for leaf in _leaves(v)]
    return [value]


class GraphLowering(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, example_inputs, is_inference: bool = False):
        super().__init__(gm, garbage_collect_values=False)
        self.example_inputs = list(example_inputs)
        self.graph_inputs: dict[str, ir.InputBuffer] = {}
        self.graph_input_names: list[str] = []
        self.constants: dict[str, torch.Tensor] = {}
        self.buffers: list[ir.Buffer] = []
        self.name_to_buffer: dict[str, ir.Buffer] = {}
        self.graph_outputs: list[Any] = []
        self.output_spec = None
        self.fallback_reasons: list[str] = []
        self.current_node: torch.fx.Node | None = None
        self.current_origins: list[str] = []  # FX nodes inlined into what is being built
        self.device_types: set[str] = set()
        #: size symbol -> Python expression over the wrapper's inputs that computes it
        #: (``"s0"`` for a SymInt argument named s0, ``"arg0_1.size(1)"`` for a tensor's dim)
        self.size_sources: dict[sympy.Symbol, str] = {}
        self.layout_optimization = _wants_channels_last(gm, is_inference)
        #: weight name -> its channels-last version (each weight converted once, however many convs read it)
        self.channels_last_weights: dict[str, ir.Buffer] = {}
        self._nodes_by_name: dict[str, torch.fx.Node] = {}
        #: a static extern call's key (:func:`_fake_call_key`) -> its output on fake tensors: a
        #: model's repeated layers call the same matmuls on the same layouts
        self._fake_outputs: dict[tuple, Any] = {}

    def preferred_order(self, data: ir.Loops) -> list[int] | None:
        """The order a realized 4-D Pointwise of a convolution graph is laid out in (layout
        optimization), None for contiguous: the memory order of the tensor it reads, so that the
        kernel walks memory in order on both sides. A channels-last convolution output stays
        channels-last through the pointwise ops after it, and a view of it permuted to
        ``(N, H, W, C)`` (as ConvNeXt's LayerNorm and Linear layers read it) is contiguous.
        Convolution inputs are made channels-last (:meth:`channels_last_input`), which starts it."""
        if not (self.layout_optimization and isinstance(data, ir.Pointwise) and len(data.ranges) == 4):
            return None
        order = _read_order(data)
        return None if order is None or order == [0, 1, 2, 3] else order

    def channels_last_input(self, x):
        """A convolution's 4-D input in channels-last memory order, the layout cuDNN's convolutions
        run in (their output then is channels-last too): a pointwise producer is laid out so, any
        other tensor copied (once, where cuDNN would convert it inside the call)."""
        if not isinstance(x, ir.IRNode) or len(x.get_size()) != 4:
            return x
        if isinstance(x, ir.StorageBox) and not x.is_realized() and isinstance(x.data, ir.Pointwise):
            return x.realize(order=CHANNELS_LAST)
        stored = ir.realize_input(x)
        if _is_channels_last(stored.layout):
            return stored
        copy = ir.StorageBox(ir.Pointwise(stored.get_device(), stored.get_dtype(), stored.make_loader(),
                                          list(stored.get_size())), self.current_origins)
        return copy.realize(order=CHANNELS_LAST)

    def channels_last_weight(self, weight):
        """A convolution's weight in channels-last order, so that cuDNN, running a channels-last
        convolution, does not convert it inside every call. Only a graph input or a constant
        needs it (a 1x1 or depthwise weight is already channels-last as it is stored):

        * a parameter (a graph input) is copied by a generated kernel in every call, as
          TorchInductor does: one launch, where cuDNN's own conversion runs five ATen ops; with
          ``config.cache_conv_weights`` it goes through ``runtime/conv_weights.channels_last_weight``
          instead, which converts it at the first call and reuses the copy while the weight is
          unchanged (not under CUDA graphs, whose replays run no Python);
        * a constant (freezing) is converted here, once: the compiled function gets the copy.
        """
        if not (isinstance(weight, ir.InputBuffer) and len(weight.get_size()) == 4) \
                or _is_channels_last(weight.layout):
            return weight
        name = weight.get_name()
        if name in self.channels_last_weights:
            return self.channels_last_weights[name]
        if name in self.constants:
            copy = self.constants[name].contiguous(memory_format=torch.channels_last)
            self.constants[f"{name}_channels_last"] = copy
            converted = self._input_buffer(f"{name}_channels_last", copy)
        elif config.cache_conv_weights and not config.triton.cudagraphs:
            n, c, h, w = weight.get_size()
            layout = ir.Layout(weight.get_device(), weight.get_dtype(), [n, c, h, w], [h * w * c, 1, w * c, c], 0)
            converted = ir.ExternKernel(None, layout, "channels_last_weight", [weight], {},
                                        "extern by design: the weight's channels-last copy, kept across calls",
                                        fn=channels_last_weight,
                                        header="from tininductor.runtime.conv_weights import channels_last_weight\n")
            self.register_buffer(converted)
        else:
            converted = self.channels_last_input(weight)
        self.channels_last_weights[name] = converted
        return converted

    # ---------------------------------------------------------------- buffers

    def register_buffer(self, buf: ir.Buffer) -> str:
        if buf.name is None:
            buf.name = f"buf{len(self.buffers)}"
        if not buf.origins:
            buf.origins = list(self.current_origins)
        self.buffers.append(buf)
        self.name_to_buffer[buf.name] = buf
        self.device_types.add(buf.get_device().type)
        return buf.name

    def get_buffer(self, name: str) -> ir.Buffer:
        if name in self.name_to_buffer:
            return self.name_to_buffer[name]
        return self.graph_inputs[name]

    def origin_ops(self, origins) -> list[str]:
        """Op names (``add``, ``sin``) of FX nodes, for kernel names: each node's own op, or with
        ``config.descriptive_names == "original_aten"`` the op it was decomposed from. A ``detach``
        computes nothing (it only stops gradients) and names nothing."""
        nodes = self._nodes_by_name
        if any(o not in nodes for o in origins):  # built once per graph (kernel names ask per node)
            nodes = self._nodes_by_name = {n.name: n for n in self.module.graph.nodes}
        original = config.descriptive_names == "original_aten"
        return [op_name(original and nodes[o].meta.get("original_aten") or nodes[o].target)
                for o in origins if o in nodes and nodes[o].op == "call_function"
                and nodes[o].target is not torch.ops.aten.detach.default]

    # ---------------------------------------------------------------- fx.Interpreter hooks

    def run(self, *args):
        with V.set_graph_handler(self):
            return super().run(*args)

    def run_node(self, n: torch.fx.Node):
        if n.op == "call_function" and isinstance(n.meta.get("val"), torch.SymInt):
            return size_expr(n.meta["val"])  # size arithmetic (sym_size, s0 * 4): its ShapeEnv expression
        if n.op == "call_function" and isinstance(n.meta.get("val"), torch.SymFloat):
            return n.meta["val"].node.expr  # a float computed from sizes (``2.0 / x.shape[-1]``)
        self.current_node = n
        self.current_origins = self._input_origins(n) + [n.name] if n.op == "call_function" else []
        try:
            result = super().run_node(n)
        finally:
            self.current_node = None
        for leaf in _leaves(result):
            box = leaf.unwrap_storage() if isinstance(leaf, ir.View) else leaf
            if isinstance(box, ir.StorageBox) and not box.is_realized():
                box.origins = list(self.current_origins)
        # inline a pointwise producer into each user, unless that recomputes too much. A node with
        # several outputs (max pooling's values and indices) is used through one getitem node per
        # output: each of those counts its own output's users, and an output nobody reads stays
        # unrealized (never computed)
        if n.op == "call_function" and len(n.users) > 1 and not isinstance(result, (tuple, list)):
            for leaf in _leaves(result):
                box = leaf.unwrap_storage() if isinstance(leaf, ir.View) else leaf
                if isinstance(box, ir.StorageBox):
                    box.mark_reuse(len(n.users))
        return result

    def _input_origins(self, n: torch.fx.Node) -> list[str]:
        """Origins of the not-yet-realized inputs of ``n`` (they get inlined into it)."""
        origins: list[str] = []
        for arg in n.all_input_nodes:
            for leaf in _leaves(self.env.get(arg)):
                box = leaf.unwrap_storage() if isinstance(leaf, ir.View) else leaf
                if isinstance(box, ir.StorageBox) and not box.is_realized():
                    origins += [o for o in box.origins if o not in origins]
        return origins

    def placeholder(self, target, args, kwargs):
        example = self.example_inputs[len(self.graph_input_names)]
        name = self.current_node.name
        self.graph_input_names.append(name)
        if isinstance(example, torch.SymInt):  # a size passed as an int at run time
            expr = size_expr(example)
            if isinstance(expr, sympy.Symbol):
                self.size_sources.setdefault(expr, name)
            return expr
        if not isinstance(example, torch.Tensor):
            raise LoweringDeclined(f"non-tensor graph input {name}={example!r}")
        buf = self._input_buffer(name, example)
        for d, s in enumerate(buf.layout.size):
            if isinstance(s, sympy.Symbol):
                self.size_sources.setdefault(s, f"{name}.size({d})")
        return buf

    def size_symbols(self) -> set:
        """The size symbols this graph's buffers and kernels use (empty for a static graph)."""
        return set(self.size_sources)

    def _input_buffer(self, name, tensor: torch.Tensor) -> ir.InputBuffer:
        # offset 0: kernels and reinterpret_tensor address relative to the tensor's data_ptr
        layout = ir.Layout(tensor.device, tensor.dtype, [size_expr(s) for s in tensor.shape],
                           [size_expr(s) for s in tensor.stride()], 0)
        buf = ir.InputBuffer(name, layout)
        self.graph_inputs[name] = buf
        self.device_types.add(tensor.device.type)
        return buf

    def get_attr(self, target, args, kwargs):
        value = self.fetch_attr(target)
        if not isinstance(value, torch.Tensor):
            return value
        name = "_const_" + target.replace(".", "_")
        if value.dim() == 0 and value.device.type == "cpu":
            device = _scalar_destination(self.current_node)
            if device is not None:
                value = value.to(device)  # copied once, here
        self.constants[name] = value
        return self._input_buffer(name, value)

    def call_function(self, target, args, kwargs):
        if target is operator.getitem:
            return args[0][args[1]]
        if target is torch.ops.aten.convolution.default:
            return self.convolution(*args, **kwargs)
        if getattr(target, "overloadpacket", None) in EXTERN_OPS:
            return self.extern_kernel(target, args, kwargs, "extern by design: library kernel")
        bad = self._dtype_without_kernels(args, kwargs)
        if bad is not None:
            return self.extern_kernel(target, args, kwargs, f"fallback: {target}: generated kernels have no {bad} type")
        lowering = lookup(target)
        if lowering is None:
            return self.extern_kernel(target, args, kwargs, f"fallback: no lowering for {target}")
        try:
            return lowering(*args, **kwargs)
        except LoweringDeclined as e:
            return self.extern_kernel(target, args, kwargs, f"fallback: {target}: {e}")

    def convolution(self, x, weight, bias, *args, **kwargs):
        """A convolution is a library kernel. Its input is channels-last under layout optimization.
        On a GPU its bias is added by the kernel that reads its output (``config.split_conv_bias``,
        as TorchInductor does): cuDNN would add it in a kernel of its own, another pass over the
        output, while a pointwise add fuses into the consumer (the normalisation, the activation).
        A convolution whose output only leaves the graph keeps its bias: no kernel reads it."""
        conv = torch.ops.aten.convolution.default
        if self.layout_optimization:
            x = self.channels_last_input(x)
            weight = self.channels_last_weight(weight)
        on_gpu = isinstance(x, ir.IRNode) and x.get_device().type != "cpu"
        # an output of the graph that nothing else reads: no kernel would take the add in, cuDNN's is free
        only_output = self.current_node is not None and all(u.op == "output" for u in self.current_node.users)
        if bias is None or only_output or not (config.force_split_conv_bias or (config.split_conv_bias and on_gpu)):
            return self.extern_kernel(conv, (x, weight, bias, *args), kwargs, "extern by design: library kernel")
        out = self.extern_kernel(conv, (x, weight, None, *args), kwargs,
                                 "extern by design: library kernel (its bias is added by the consumer's kernel)")
        channel = lookup(torch.ops.aten.view.default)(bias, [-1] + [1] * (len(out.get_size()) - 2))
        return lookup(torch.ops.aten.add.Tensor)(out, channel)

    def _dtype_without_kernels(self, args, kwargs) -> torch.dtype | None:
        """A dtype of this op's tensors that Triton/C++ kernels cannot hold (complex), if any:
        such an op runs in torch, as a fallback with its reason logged, instead of failing."""
        dtypes = [a.get_dtype() for a in _leaves((args, kwargs)) if isinstance(a, ir.IRNode)]
        val = self.current_node.meta.get("val") if self.current_node is not None else None
        dtypes += [v.dtype for v in _leaves(val) if isinstance(v, torch.Tensor)]
        return next((d for d in dtypes if d not in KERNEL_DTYPES), None)

    def call_method(self, target, args, kwargs):
        raise LoweringDeclined(f"call_method {target} in a prim graph (decompose first)")

    def call_module(self, target, args, kwargs):
        raise LoweringDeclined(f"call_module {target} in a prim graph (decompose first)")

    def output(self, target, args, kwargs):
        leaves, self.output_spec = tree_flatten(args[0])
        traced = tree_flatten(self.current_node.args[0])[0] if self.current_node is not None else []
        # a training forward's saved values (from ``meta["saved_from"]`` on): only its own backward
        # reads them, compiled for the layouts this graph chose (AOT autograd), so a channels-last
        # activation is saved as it is instead of copied back to the traced layout
        saved_from = self.current_node.meta.get("saved_from") if self.current_node is not None else None
        keep_layout = self.layout_optimization and saved_from is not None
        for i, leaf in enumerate(leaves):
            if isinstance(leaf, ir.IRNode):
                node = traced[i] if i < len(traced) else None
                val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
                leaf = ir.realize_input(leaf) if keep_layout and i >= saved_from else self._realize_output(leaf, val)
            self.graph_outputs.append(leaf)
        return args[0]

    def output_strides(self) -> list[tuple[int, ...] | None]:
        """Each output's strides as this graph stores it (None: not a tensor, or symbolic)."""
        strides = []
        for out in self.graph_outputs:
            layout = getattr(out, "layout", None)
            static = layout is not None and all(isinstance(v, (int, sympy.Integer)) for v in layout.stride)
            strides.append(tuple(int(v) for v in layout.stride) if static else None)
        return strides

    def _realize_output(self, leaf: ir.IRNode, val) -> "ir.Buffer | ir.ReinterpretView":
        """Realize a graph output with the strides it had in the traced graph.

        Our buffers are contiguous, but the trace (fake tensors) may have given a value other
        strides: a pointwise op keeps a transposed input's layout, an extern op's output layout
        follows its inputs' (CPU flash attention). The backward graph was compiled from that
        same trace and reads a saved tensor by the traced strides, and callers expect eager's
        layout, so an output whose strides differ is written (or copied) with the traced ones.
        An expanded dim (stride 0) is computed once and viewed with stride 0.
        """
        size = leaf.get_size()
        if not isinstance(val, torch.Tensor):
            return ir.realize_input(leaf)
        shape = [size_expr(n) for n in val.shape]  # ints, or sympy over size symbols (dynamic shapes)
        if any(n == 0 for n in shape) or shape != list(size):
            return ir.realize_input(leaf)
        want = [size_expr(st) for st in val.stride()]
        compact = [1 if st == 0 else n for n, st in zip(size, want)]
        if compact == size and isinstance(leaf, ir.StorageBox) and isinstance(leaf.data, ir.Pointwise):
            data = leaf.data  # not in memory yet: store it with the traced strides directly
        else:
            out = ir.realize_input(leaf)
            if _same_strides(out.layout, want):
                return out
            data = ir.Pointwise(out.get_device(), out.get_dtype(), out.make_loader(), compact)
        buf = ir.ComputedBuffer(None, ir.Layout(leaf.get_device(), leaf.get_dtype(), compact, want, 0), data)
        buf.origins = list(getattr(leaf, "origins", []) or self.current_origins)
        self.register_buffer(buf)
        if isinstance(leaf, ir.StorageBox) and leaf.data is data:
            leaf.data = buf
        if compact != size:
            return ir.ReinterpretView(buf, ir.Layout(leaf.get_device(), leaf.get_dtype(), size, want, 0))
        return buf

    # ---------------------------------------------------------------- extern / fallback

    def extern_kernel(self, target, args, kwargs, reason: str):
        """Call ``target`` through torch; inputs are realized, output layouts come from fake tensors."""
        if not reason.startswith("extern"):
            log.info("%s (node %s)", reason, self.current_node.name if self.current_node else "?")
            self.fallback_reasons.append(reason)
        args, kwargs = tree_map(lambda a: ir.realize_input(a) if isinstance(a, ir.IRNode) else a, (args, kwargs))

        # fake tensors on the real device, laid out as our buffers are: an op's output strides can
        # depend on its inputs' (a fallback attention keeps a transposed query's layout, a
        # convolution a channels-last input's) and on the device (meta kernels differ), and the
        # kernels that read the output index by these strides. The FX node's fake value will not
        # do: it was computed from the traced graph's layouts, not from the buffers we chose.
        symbolic = any(isinstance(a, (ir.Buffer, ir.ReinterpretView)) and not a.layout.is_static()
                       for a in tree_flatten((args, kwargs))[0]) or any(
            isinstance(a, sympy.Basic) and not a.is_number for a in tree_flatten((args, kwargs))[0])
        shape_env = self._shape_env() if symbolic else None
        key = None if symbolic else _fake_call_key(target, args, kwargs)
        try:
            if key in self._fake_outputs:  # (None is never a key)
                out = self._fake_outputs[key]
            else:
                if symbolic and shape_env is None:
                    raise LoweringDeclined("symbolic sizes without a ShapeEnv")
                fake_mode = _fake_mode(shape_env)
                # symbolic: torch's Python meta kernels (the Python dispatcher) keep sizes symbolic, and
                # guards are suppressed: a kernel that reads a size as an int must not specialise the
                # graph. Such a kernel gives sizes that are plain numbers: then the traced value is used.
                quiet = shape_env.suppress_guards() if shape_env is not None else contextlib.nullcontext()
                dispatcher = enable_python_dispatcher() if shape_env is not None else contextlib.nullcontext()
                with fake_mode, dispatcher, quiet:
                    fake_args, fake_kwargs = tree_map(lambda a: _to_fake(a, shape_env), (args, kwargs))
                    out = target(*fake_args, **fake_kwargs)
                if shape_env is not None and not _same_sizes(out, self.current_node.meta.get("val")):
                    raise LoweringDeclined("the fake kernel specialised a symbolic size")
                if key is not None:
                    self._fake_outputs[key] = out
        except Exception as e:  # no fake kernel: take shapes from the FX node's example value
            out = self.current_node.meta.get("val") if self.current_node is not None else None
            if out is None:
                raise LoweringDeclined(f"cannot compute output layout of {target}: {e}") from e
        device = self._node_device(args)
        kernel = _kernel_name(target)

        def layout_of(t):
            return ir.Layout(device, t.dtype, [size_expr(s) for s in t.shape], [size_expr(s) for s in t.stride()], 0)

        if isinstance(out, torch.Tensor):
            buf = ir.ExternKernel(None, layout_of(out), kernel, args, kwargs, reason, fn=target)
            self.register_buffer(buf)
            return buf
        if isinstance(out, (tuple, list)):
            parent = ir.ExternKernel(None, None, kernel, args, kwargs, reason, fn=target)
            parent.layout = ir.Layout(device, torch.uint8, [0], [1])
            self.register_buffer(parent)
            results = []
            for i, t in enumerate(out):
                if isinstance(t, torch.Tensor):
                    mo = ir.MultiOutput(None, layout_of(t), parent, i)
                    self.register_buffer(mo)
                    results.append(mo)
                else:
                    results.append(t)
            return tuple(results)
        if out is None and self.current_node is not None and not self.current_node.users:
            # an op run for its effect alone (``aten._assert_async``: a check that raises): kept as a call
            # with no output, in graph order (a MultiOutput parent's empty layout)
            buf = ir.ExternKernel(None, None, kernel, args, kwargs, reason, fn=target)
            buf.layout = ir.Layout(device, torch.uint8, [0], [1])
            self.register_buffer(buf)
            return None
        raise LoweringDeclined(f"{target} returned {type(out).__name__}")

    def _shape_env(self):
        """The ShapeEnv that owns this graph's size symbols (from a SymInt of the current node's
        value or of an example input), or None."""
        values = [self.current_node.meta.get("val") if self.current_node is not None else None, self.example_inputs]
        for v in tree_flatten(values)[0]:
            sizes = list(v.shape) + list(v.stride()) if isinstance(v, torch.Tensor) else [v]
            for s in sizes:
                if isinstance(s, torch.SymInt):
                    return s.node.shape_env
        return None

    def _node_device(self, args) -> torch.device:
        val = self.current_node.meta.get("val") if self.current_node is not None else None
        for v in tree_flatten(val)[0]:
            if isinstance(v, torch.Tensor):
                return v.device
        for a in tree_flatten(args)[0]:
            if isinstance(a, ir.IRNode):
                return a.get_device()
        return torch.device("cpu")

    # ---------------------------------------------------------------- pretty

    def ir_str(self) -> str:
        return self.ir_text()()

    def ir_text(self) -> Callable[[], str]:
        """What prints the IR later (``artifacts.LazyText``): the inputs and buffers lowered, without
        the graph itself (which holds its constants)."""
        nodes = [*self.graph_inputs.values(), *self.buffers]
        return lambda: "\n".join(map(repr, nodes))


def _wants_channels_last(gm: torch.fx.GraphModule, is_inference: bool) -> bool:
    """Layout optimization (``config.layout_optimization``, TorchInductor's), decided once per graph:
    an inference graph with 2-D convolutions feeds them channels-last inputs, the layout cuDNN's
    (CUDA) and oneDNN's (CPU, ``torch.backends.mkldnn``) convolutions run fastest in, so that no
    convolution converts NCHW to NHWC and back; the pointwise kernels after them keep and walk that
    order (``preferred_order``). On the CPU MobileNetV2's convolutions take 41 instead of 63 us
    each on average (small sizes, 2 cores). Training graphs on CUDA too with ``layout_optimization_training``
    (off by default; a backward is recognised by its ``convolution_backward``): the forward saves its activations in the
    layout it chose and the backward is compiled for those strides (``aot_autograd._saved_layouts``).
    On the CPU training graphs keep NCHW. ``config.force_layout_optimization``: every convolution graph (tests)."""
    if not (config.layout_optimization or config.force_layout_optimization):
        return False
    conv_ops = (torch.ops.aten.convolution.default, torch.ops.aten.convolution_backward.default)
    convs = [n for n in gm.graph.nodes if n.op == "call_function" and n.target in conv_ops
             and isinstance(n.args[0], torch.fx.Node) and isinstance(n.args[0].meta.get("val"), torch.Tensor)
             and n.args[0].meta["val"].dim() == 4]
    if not convs:
        return False
    if config.force_layout_optimization:
        return True
    devices = {n.args[0].meta["val"].device.type for n in convs}
    mkldnn = torch.backends.mkldnn.enabled and torch.backends.mkldnn.is_available()
    if not is_inference and not (config.layout_optimization_training and devices == {"cuda"}):
        return False
    if devices == {"cuda"}:
        return not convolutions_are_rare(gm, len(convs))
    return devices == {"cpu"} and mkldnn


def convolutions_are_rare(gm: torch.fx.GraphModule, convs: int) -> bool:
    """Fewer than one convolution per 300 nodes: a transformer whose only convolution embeds the
    image's patches (ViT, Swin). Channels-last would there buy one convolution's speed for
    converting the image and the weight in every call, so such a graph keeps its layouts on CUDA
    (TorchInductor's ``decide_layout_opt`` draws the same line; on the CPU oneDNN's convolutions
    want channels-last whatever surrounds them)."""
    return len(gm.graph.nodes) >= 300 * convs


#: (N, C, H, W) stored in (N, H, W, C) order
CHANNELS_LAST = [0, 2, 3, 1]


def _read_order(data: ir.Pointwise) -> list[int] | None:
    """The memory order of what ``data``'s body reads: of the loads that walk a whole tensor of its
    size (an affine index with a nonzero step along every dim longer than 1), the first one not in
    the logical order, else the first; its dims from the largest step to the smallest (dims of
    size 1 keep their place). A modulo steps as its argument does: a ``cat`` reads each input at
    ``(j - start) % n`` along the joined dim (exact inside that input's slice), so a cat of
    channels-last inputs is written channels-last, where it would otherwise walk its inputs across
    the channels. None when no load qualifies (an index computed through a reshape's divisions, a
    broadcast, an indirect index)."""
    handler = ReadWrites()
    ranges = data.get_size()
    loop_vars = [sym(f"i{d}") for d in range(len(ranges))]
    with V.set_ops_handler(handler):
        data.inner_fn(loop_vars)
    long_dims = [d for d, n in enumerate(ranges) if n != 1]
    orders = []
    for _, index in handler.reads:
        index = index.replace(lambda e: isinstance(e, ModularIndexing), lambda e: e.args[0])
        steps = [index.coeff(v) for v in loop_vars]
        if not all(isinstance(c, sympy.Integer) for c in steps) or any(steps[d] == 0 for d in long_dims):
            continue
        if sympy.expand(index - sum(c * v for c, v in zip(steps, loop_vars))).free_symbols:
            continue  # not affine in the loop variables
        ordered = iter(sorted(long_dims, key=lambda d: -steps[d]))
        orders.append([d if ranges[d] == 1 else next(ordered) for d in range(len(ranges))])
    return next((o for o in orders if o != sorted(o)), orders[0] if orders else None)


def _is_channels_last(layout: ir.Layout) -> bool:
    """A 4-D layout whose memory order is (N, H, W, C) (dims of size 1 in any place)."""
    n, c, h, w = layout.size
    return _same_strides(layout, [h * w * c, 1, w * c, c])


def _same_strides(layout: ir.Layout, stride) -> bool:
    """Equal strides, ignoring dimensions of size 1 (their stride never moves an index)."""
    return all(n == 1 or a == b for n, a, b in zip(layout.size, layout.stride, stride))


def _kernel_name(target) -> str:
    """A Python expression naming the torch callable, for the wrapper (``torch.mm``,
    ``torch.ops.aten.cumsum.default``)."""
    if isinstance(target, torch._ops.OpOverload) and target._overloadname == "default" \
            and target._schema.name in ir.LIBRARY_KERNELS:
        return ir.LIBRARY_KERNELS[target._schema.name]
    if isinstance(target, torch._ops.OpOverload):
        ns = target.namespace
        return f"torch.ops.{ns}.{target._opname}.{target._overloadname}"
    mod = getattr(target, "__module__", None) or "torch"
    return f"{mod}.{target.__name__}"


_FAKE_MODE = None


def _fake_mode(shape_env=None):
    """A FakeTensorMode for computing extern kernels' output layouts: one shared mode for static
    sizes (made on first use), or one over the graph's ShapeEnv, whose symbols the sizes are."""
    global _FAKE_MODE

    if shape_env is not None:
        return FakeTensorMode(shape_env=shape_env, allow_non_fake_inputs=True)
    if _FAKE_MODE is None:
        _FAKE_MODE = FakeTensorMode(allow_non_fake_inputs=True)
    return _FAKE_MODE


def _sym_int(expr, shape_env):
    """A size as the fake kernel takes it: an int, or a SymInt of ``shape_env`` for an expression
    over its symbols (with the example's value as its hint)."""
    if not isinstance(expr, sympy.Basic):
        return expr
    if expr.is_Integer:
        return int(expr)
    values = getattr(shape_env, "backed_var_to_val", None)  # torch >= 2.12's name for var_to_val
    hint = expr.xreplace(shape_env.var_to_val if values is None else values)
    return shape_env.create_symintnode(expr, hint=int(hint) if hint.is_Integer else None)


def _same_sizes(out, traced) -> bool:
    """Do ``out``'s tensors have the traced values' sizes, as size expressions (symbol for symbol)?"""
    outs, vals = tree_flatten(out)[0], tree_flatten(traced)[0]
    if traced is None or len(outs) != len(vals):
        return False
    return all(not isinstance(o, torch.Tensor) or isinstance(v, torch.Tensor) and
               [size_expr(s) for s in o.shape] == [size_expr(s) for s in v.shape] for o, v in zip(outs, vals))


def _fake_call_key(target, args, kwargs) -> tuple | None:
    """What decides a static extern call's outputs on fake tensors: the op, each buffer's dtype,
    device and layout, and every other argument with its type (``1`` and ``1.0`` promote
    differently); None where an argument cannot be a dict key."""

    def part(a):
        if isinstance(a, (ir.Buffer, ir.ReinterpretView)):
            lay = a.layout
            return ("buffer", lay.dtype, lay.device, tuple(lay.size), tuple(lay.stride), lay.offset)
        if isinstance(a, (list, tuple)):
            return (type(a), tuple(part(x) for x in a))
        if isinstance(a, dict):
            return (dict, tuple((k, part(v)) for k, v in a.items()))
        hash(a)  # TypeError if it cannot be a key
        return (type(a), a)

    try:
        return target, part(args), part(kwargs)
    except TypeError:
        return None


def _to_fake(a, shape_env):
    """A buffer as a fake tensor laid out as the buffer is (sizes as SymInts when symbolic)."""
    if isinstance(a, (ir.Buffer, ir.ReinterpretView)):
        lay = a.layout
        if shape_env is None or lay.is_static():
            storage = torch.empty(lay.storage_size() + 1, dtype=lay.dtype, device=lay.device)
            return storage.as_strided(lay.size, lay.stride, lay.offset)
        size = [_sym_int(e, shape_env) for e in lay.size]
        stride = [_sym_int(e, shape_env) for e in lay.stride]
        return torch.empty_strided(size, stride, dtype=lay.dtype, device=lay.device)
    if isinstance(a, sympy.Basic) and shape_env is not None:
        return _sym_int(a, shape_env)
    return a
