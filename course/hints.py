"""Hints for the exercises, in levels: ask for them when the spec and the notebook are not enough.

    import course
    course.hint("2.1")            # level 1: which idea to use
    course.hint("2.1", level=2)   # level 2: the steps
    course.hint("2.1", level=3)   # where there is one: the pitfall the tests check

A stub's spec says *what* to build and how it is checked; these say *how*, one step at a time,
so a learner who asks for help still writes the answer. ``SYMPTOMS`` maps failure messages the
graded tests often see to the likely mistake (used by the test report).
"""
from __future__ import annotations

import re

HINTS: dict[str, list[str]] = {
    "0.1": ["A TorchDispatchMode sees every ATen call in __torch_dispatch__; `func` is the OpOverload. "
            "What is str(func) for x.sin()?",
            "Increment self.counts under str(func), then call func with the args and kwargs you got and return "
            "what it returns: the mode must not change what the program computes."],
    "0.2": ["tracker.outputs holds every tensor an op returned. Several of them can share one storage "
            "(views, in-place ops): count memory by storage, with _storage_key.",
            "Build the set of storage keys of inputs and returned tensors (not intermediates), then walk "
            "tracker.outputs once, adding untyped_storage().nbytes() the first time you see a key that is "
            "not in that set."],
    "0.3": ["A GPU call returns before its work is done: a clock read is only meaningful right after "
            "sync(). Which clock reads need one?",
            "sync(); start = clock(); fn(*args); sync(); elapsed = clock() - start. Do it for the first call, "
            "run the warmup calls untimed, then do it for each of the repeat calls; return the median.",
            "The fake device in the tests queues work before benchmark is even called: synchronise before "
            "the very first clock read too."],
    "0.4": ["The backend contract: Dynamo calls backend(gm, example_inputs) once per graph and runs the "
            "callable you return in place of that graph.",
            "Append gm and (a list of) example_inputs to the two lists, then return something that runs the "
            "graph unchanged: the GraphModule's forward."],
    "1.1": ["get_instructions(code) gives the normalised instructions; globals are read by one opname. "
            "Nested functions and lambdas are separate code objects in code.co_consts.",
            "Collect inst.argval for that opname, then recurse into every constant that is a types.CodeType "
            "(recursion handles code nested at any depth)."],
    "1.2": ["Each basic has a fixed stack effect: LOAD_* push one value, STORE_FAST pops one, BINARY_OP pops "
            "two and pushes one, RETURN_VALUE pops one. Reading frame.stack[-1] is not popping.",
            "BINARY_OP: the top of the stack is the RIGHT operand; pop it first. RETURN_VALUE: set "
            "frame.return_value and frame.returned. Return True for these five, False (touching nothing) "
            "for anything else.",
            "The tests check the stack depth after every instruction and that the stack is empty at the return."],
    "1.3": ["Below the arguments sit two call slots; bytecode.resolve_call_slots reads them the same way on "
            "every version and returns (callable, leading_args).",
            "Take the last inst.argval values off the stack (in order), then the two slots (slot1 is the top, "
            "slot0 below). The last len(inst.kw_names) arguments are keywords, named by inst.kw_names.",
            "leading_args (self of a method load) go before the positional arguments."],
    "1.4": ["sys.settrace installs a global trace function; per-frame opcode events need frame.f_trace and "
            "frame.f_trace_opcodes = True on fn's frame only.",
            "Map each offset to the normalised instructions that came from it (some offsets give none, 3.12's "
            "RETURN_CONST gives two) and count them all on each 'opcode' event at frame.f_lasti.",
            "Save sys.gettrace() first and restore it in a finally block: the tests install a trace function "
            "before calling you and make fn raise."],
    "1.5": ["A TorchFunctionMode's __torch_function__ sees each torch call; sys._getframe() inside it is deep in "
            "the call stack.",
            "Walk f_back from sys._getframe(1) until frame.f_code is fn.__code__; record "
            "torch.overrides.resolve_name(func) under that frame's f_lineno (a list per line, in call order), "
            "then call func(*args, **(kwargs or {}))."],
    "2.1": ["The same stack discipline as the StackMachine, but the values are VariableTrackers: tx.pop() and "
            "tx.push().",
            "The top of the stack is the right operand. Look the operator up in bc.BINARY_OPS by inst.argval and "
            "let BuiltinVariable.binop apply it (constants fold, tensors become graph nodes)."],
    "2.2": ["The condition must be popped whether or not you jump. value.truth(tx) is its Python truth at trace "
            "time (bool(value) is the truth of the tracker object, always True).",
            "Pop, compare value.truth(tx) with jump_when, and set tx.ip = inst.target to jump."],
    "2.3": ["Same layout as Exercise 1.3: two call slots, then inst.argval arguments; tx.popn(n) pops n values "
            "in order.",
            "Pop the arguments, then slot1 (top) and slot0; bc.resolve_call_slots(slot0, slot1, lambda v: v is "
            "NULL) gives the callable and leading args; split keywords by inst.kw_names; push "
            "fn.call_function(tx, args, kwargs)."],
    "2.4": ["it.next_item() returns the next variable or None. While items remain, the iterator stays on the "
            "stack under the item.",
            "None: pop the iterator and set tx.ip = inst.target. Otherwise push the item. The tests check the "
            "stack effect of every FOR_ITER and an empty stack at the return."],
    "3.1": ["True == 1 and 1 == 1.0 in Python, but a graph specialised on 1 is not valid for True or 1.0: "
            "the type must match exactly.",
            "Singletons: `ref is None`. int/float/str: a type condition and a value condition, the literal "
            "written with repr. Any other type: bind the type and the value with scope.constant(...) and "
            "compare through those names."],
    "3.2": ["Check in the documented order and return at the first mismatch; the exact type (a subclass is "
            "not a Tensor here), then dtype, device, rank, sizes, strides, requires_grad.",
            "Copy the message formats from the docstring and the test output; type(value) is not m.type, "
            "value.device != m.device, zip over sizes and strides with their index."],
    "3.3": ["The check function runs on every call: read each source (source.name() is the expression) into a "
            "local once, even when several guards use it.",
            "Keep a dict expression -> local name; for each guard emit `if not (c1 and c2 ...): return False` "
            "with the conditions from GUARD_KINDS[g.kind].code(g, ref, scope) (ref 'None' when source is None); "
            "end with `return True`."],
    "3.4": ["Entries are newest first; only an entry compiled for this backend may be used.",
            "Return the first entry whose backend is this one and whose check_fn(L, G) is true; test the "
            "backend first, so other backends' guards never run."],
    "4.1": ["A TensorVariable's value exists only when the graph runs, after all guards: no guard can decide "
            "the branch, so the translator must break the graph.",
            "Pop the condition; for a TensorVariable call unimplemented(reason, hint=...) with a reason "
            "starting 'data-dependent branch' that mentions guards and a hint naming torch.where; otherwise "
            "tx.jump_if(inst, cond.truth(tx) == jump_when)."],
    "4.2": ["A name is needed if something at or after the offset reads it; but if a later jump goes back "
            "before the offset, the code before it runs again.",
            "Scan instructions with offset >= the break's; a jump whose target instruction (instructions[target]) "
            "starts before the offset means: return all names. Otherwise collect names read (opnames in _READS, "
            "both names of LOAD_FAST_LOAD_FAST) and return them in the order of `names`."],
    "4.3": ["torch.where(cond, a, b) picks elementwise between two computed tensors; cond can be a 0-d tensor.",
            "Compute both sides and choose with the same condition branchy uses: the sum of x, compared with > 0."],
    "4.4": ["Each break reason has a user_stack, innermost frame first; _FRAME parses one frame string.",
            "For every break reason (one site per break, duplicates included), search user_stack[0] with _FRAME "
            "and append (function name, int(line))."],
    "5.1": ["Only call_function nodes are op calls; str(node.target) names the op.",
            "collections.Counter over str(n.target) of those nodes, as a dict."],
    "5.2": ["Keep an environment node -> value; fx.node.map_arg replaces every node inside nested args "
            "(lists, tuples, dicts) with its value.",
            "placeholder: the next argument; get_attr: getattr(gm, target); call_function: target(*args, **kwargs) "
            "with both looked up; output: return its looked-up argument."],
    "5.3": ["Write the formula with aten prims only: aten.mul, aten.add, aten.erf, aten.tanh, with Python "
            "numbers as the constants.",
            "Exact: 0.5 * x * (1 + erf(x / sqrt 2)). Tanh form: 0.5 * x * (1 + tanh(sqrt(2/pi) * (x + 0.044715 x^3))). "
            "Branch on approximate."],
    "5.4": ["The normalised dims are the last len(normalized_shape) dims; mean and rstd keep them (keepdim).",
            "mean = aten.mean(x, dims, keepdim=True); rstd = aten.rsqrt(var(x, dims, correction=0, keepdim=True) + "
            "eps); out = (x - mean) * rstd, then * weight and + bias when given."],
    "5.5": ["softmax(x) = softmax(x - c) for any c along the dim; exp overflows float32 above ~88.",
            "Subtract aten.amax(x, [dim], True), exp, and divide by aten.sum(..., [dim], True) (keepdim so it "
            "broadcasts)."],
    "6.1": ["Broadcasting aligns shapes on the right: extra leading dims were prepended, size-1 dims stretched.",
            "Sum over the leading dims and (keepdim) over the dims where shape has 1 and grad does not, then "
            "aten.view to shape."],
    "6.2": ["d(a*b)/da = b, d(a*b)/db = a, each then summed back to its input's shape.",
            "Each input's gradient is grad times the other input, brought back to that input's own shape by "
            "reduce_grad (which already answers None for a number). Mind which input each product belongs to."],
    "6.3": ["Walk reversed(graph.nodes); a node's gradient is complete once all its users (later nodes) have "
            "been visited.",
            "For each call_function node with a gradient and in needs_grad: look its args and kwargs up in env, "
            "call get_vjp(node.target, rules)(grad, env[node], *args, **kwargs), and add each returned gradient "
            "into the gradient of the matching node argument (aten.add when it already has one)."],
    "6.4": ["The forward is what the outputs need (plus the primals). The backward starts from the gradients "
            "and may read forward values: those must be saved.",
            "Collect the ancestors of the outputs (the forward). Walk back from the gradients, not expanding "
            "forward nodes or tangents; the forward nodes you reach are the saved values."],
    "7.1": ["ir.Pointwise(device, dtype, inner_fn, ranges): inner_fn(index) returns an ops value for one "
            "element; x.make_loader() reads x.",
            "value = load(index); for float16/bfloat16 convert with ops.to_dtype to float32, compute "
            "ops.mul(value, ops.sigmoid(value)), convert back; wrap the Pointwise in ir.StorageBox."],
    "7.2": ["permute: output dim i is input dim dims[i]. expand: the output may have extra leading dims; a "
            "size-1 input dim that grew is always read at 0.",
            "permute: build the input index with out[dims[i]] = index[i]. expand: input dim i corresponds to "
            "output dim i + (len(new) - len(old)); use sympy.Integer(0) where old is 1 and new is not."],
    "7.3": ["Two conditions: every node has a kind in this kernel, and a buffer written in the kernel is read "
            "at exactly the index where it was written.",
            "Collect the writes (name -> set of indices) over all nodes, then check every read of a written "
            "name uses that single index."],
    "7.4": ["The handler sees every load and store of a body as it is traced; sympy.expand makes equal "
            "indices compare equal.",
            "Append (name, sympy.expand(index)) to reads in load (every load, repeats included) and to writes in "
            "store; load must return some placeholder value."],
    "8.1": ["Operands are temporaries or literals; a format string combines {0}, {1}, {2}. Python operators "
            "work on Triton blocks; functions are tl.exp, tl.sqrt, tl.sin, tl.where.",
            "Mind the order of non-commutative ops and strictness of lt; relu and maximum should propagate NaN "
            "like eager (triton_helpers.maximum)."],
    "8.2": ["Index variables named x* are rows, r* the reduced dim: look at the free symbols' first letters.",
            "mask_for: 'xmask', 'rmask', 'xmask & rmask' or None. Loads: tl.load(ptr + (index), mask, other=0) so "
            "masked lanes read 0; stores: tl.store(ptr + (index), value, mask)."],
    "8.3": ["Lanes outside the tensor hold garbage (or the load's 0): they must not change the result, so "
            "replace them by the reduction's identity first.",
            "tl.where(xmask & rmask, value, reduction_init(...)), reduce with REDUCTIONS[type][1], and keep "
            "a column with [:, None] so it broadcasts in later nodes."],
    "8.4": ["Blocks are powers of two (next_power_of_2); the grid must cover every row.",
            "Pointwise: XBLOCK = min(next_power_of_2(numel), 1024), RBLOCK 1. Reduction: RBLOCK = "
            "next_power_of_2(rnumel), XBLOCK within MAX_BLOCK_ELEMENTS // RBLOCK. num_warps ~ block/256 clamped "
            "to 1..8; grid = ceil(numel / XBLOCK)."],
    "9.1": ["Eager's NaN rules: relu(nan) and maximum(x, nan) are nan. A comparison with NaN is false.",
            "Write relu and maximum with the conditional operator so a NaN operand is returned; where is a "
            "conditional; rsqrt is 1 / std::sqrt."],
    "9.2": ["init is the identity of the reduction for acc_type; max/min must propagate NaN through the "
            "prelude's tiny_max/tiny_min and their OpenMP reductions.",
            "sum: 0, +=, '+'; prod: 1, *=, '*'; max: -infinity (floats) or numeric_limits<T>::lowest() (integers); "
            "min: +infinity or numeric_limits<T>::max()."],
    "9.3": ["Row i occupies x[i * cols + j] for j in 0..cols-1; accumulate in double.",
            "#pragma omp parallel for over rows; inside, double acc = 0 and #pragma omp simd reduction(+:acc) over "
            "cols; store static_cast<float>(acc)."],
    "9.4": ["A rename within one filesystem is atomic: write elsewhere in the same directory, then os.replace.",
            "tempfile.mkstemp(dir=path.parent), write and flush (os.fsync), os.replace(tmp, path); in a finally "
            "block remove the temporary if it still exists."],
    "9.5": ["Missing files mean False, not an exception; the checksum file may end with a newline.",
            "Read the checksum text stripped and the library's bytes (catch OSError), compare "
            "hashlib.sha256(bytes).hexdigest() with it; an empty checksum is not a match."],
    "10.1": ["Substitute the example values (var_to_val) into the relation to get its answer; what must stay "
             "true is the relation if the answer was yes, its negation if no. No free symbols: nothing to guard.",
             "evaluate_expr: value = bool(expr.xreplace(var_to_val)); if expr.free_symbols, append expr or "
             "sympy.Not(expr) unless already there. produce_guards: for each symbol, its other sources == its "
             "first; then 2 <= first source per symbol; then each guard with symbols replaced by "
             "sympy.Symbol(first source), printed by pexpr."],
    "10.2": ["Walk both shapes from the right, treating a missing dim as 1. A 1 takes the other size; equal sizes "
             "stay; two different expressions must be equal at run time: that is a guard. For view, the -1 is "
             "numel divided by the product of the other sizes.",
             "broadcast: two different numbers raise ValueError; otherwise append Eq(x, y) to guards and keep the "
             "number if one side is a number. view: sympify everything, refuse two -1; without -1 the product must "
             "simplify to numel; with one, sympy.simplify(numel / known) must have denominator 1 "
             "(sympy.fraction(sympy.together(q)))."],
    "10.3": ["The frame state remembers each dim's size until it changes; then the dim is None for good. A compile "
             "gives symbols to the dims the policy asks for, except sizes 0 and 1.",
             "update_frame_state: None -> list(sizes); other rank -> all None; else keep old where equal, None "
             "where not. symbolic_dims: skip n in (0, 1); take i if dynamic is True, or i is marked, or "
             "dynamic is None and state[i] is None."],
    "10.4": ["Strides: the innermost is 1, each outer one the product of the sizes inside it. A flat output "
             "index gives coordinate d as xindex // stride_d, wrapped by % size_d except the outermost dim.",
             "Align the input's dims on the right (lead = len(out) - len(in)); skip missing and size-1 input "
             "dims; sum coordinate * input stride, with sympy.floor(xindex / stride) and sympy.Mod. An input of "
             "the output's own sizes is read at xindex."],
    "11.1": ["Read every tensor input once, write every distinct output once; non-tensors cost nothing; an "
             "output that is an input was not written.",
             "Sum numel * element_size over tensor inputs; run gm, then add each output tensor whose id you have "
             "not seen (inputs' ids start in the seen set)."],
    "11.2": ["A Python if on a tensor's value breaks the graph; torch.where keeps both sides in it.",
             "Compute y, then torch.where(y.sum() > 0, y * 2, y - 2)."],
    "11.3": ["bucket_length: the smallest bucket >= n (buckets may come unsorted); past the largest, round up to "
             "a multiple of it. The wrapper pads with zeros along dim and slices back.",
             "torch.cat([x, x.new_zeros(shape with dim = target - n)], dim=dim), call fn, then .narrow(dim, 0, n)."],
    "12.1": ["Backward produces gradients last layer first: walk reversed(params). A bucket closes once it holds "
             "cap bytes or more; the next parameter opens a new one.",
             "The first bucket (reduced first) uses first_bucket_cap, every later one bucket_cap. A parameter "
             "larger than the cap still goes into one bucket."],
    "12.2": ["Walk the op nodes backwards (reversed(gm.graph.nodes), skipping placeholders and the output); a "
             "parameter placeholder counts at its first user in forward order.",
             "Open a new piece before a node when the current one holds >= cap bytes (first_bucket_cap for the "
             "first piece built, which is the last in forward order); a leftover piece with no parameters joins "
             "the next one; number the pieces in forward order."],
    "12.3": ["Backward: pieces from the last to the first, their times adding up. Each all-reduce starts when "
             "its gradients are ready AND the previous all-reduce is done: max(comm_end, ready) + allreduce.",
             "split=False: every gradient is ready only when the whole backward ends (sum of backward times). "
             "The step ends at max(compute end, communication end)."],
}

#: failure text -> the likely mistake (checked in order; the first match is shown)
SYMPTOMS: list[tuple[str, str]] = [
    (r"too many left on the stack|changed the stack depth by \+\d+: yours \d+ vs expected -",
     "a handler left a value behind: did you read a value with stack[-1] instead of popping it?"),
    (r"too few left on the stack", "a handler popped more than it should, or did not push its result"),
    (r"holds \d+ value\(s\) at the return", "something left on the stack: an iterator not popped at the loop's end, "
                                            "or a value read without popping"),
    (r"pop from empty list", "a handler popped more values than were pushed (wrong count, or operands popped twice)"),
    (r"SyntaxError", "generated code does not parse: operands swapped or a value of the wrong kind pushed? "
                     "Check the order in which you pop and pass operands"),
    (r"trace function", "save sys.gettrace() before sys.settrace and restore it in a finally block"),
    (r"dtype mismatch|dtype .* vs expected", "compute in the dtype eager uses (half inputs in float32) and cast back"),
    (r"shape \(.*\) vs expected \(", "check which dims you reduce, keep or drop"),
]


def _task(task: str) -> str:
    match = re.fullmatch(r"(?:ch)?0*(\d+)[._](\d+)", str(task).strip().lower())
    if not match:
        raise ValueError(f"{task!r} is not an exercise; write it like '2.1'")
    return f"{int(match[1])}.{int(match[2])}"


def hint_text(task: str, level: int = 1) -> str:
    """The hint of ``level`` for exercise ``task`` ("2.1")."""
    key = _task(task)
    if key not in HINTS:
        raise ValueError(f"no exercise {key}; exercises are {', '.join(HINTS)}")
    levels = HINTS[key]
    if not 1 <= level <= len(levels):
        return f"Exercise {key} has hint levels 1 to {len(levels)}; after that, the notebook section and the tests."
    more = f" (more: course.hint({key!r}, level={level + 1}))" if level < len(levels) else " (the last level)"
    return f"Hint {level}/{len(levels)} for Exercise {key}: {levels[level - 1]}{more}"


def hint(task: str, level: int = 1) -> None:
    """Print the hint of ``level`` for exercise ``task``, e.g. ``course.hint("2.1")``."""
    print(hint_text(task, level))


def symptom_hint(text: str) -> str | None:
    """The likely mistake behind a failure message, if it shows a known symptom."""
    for pattern, advice in SYMPTOMS:
        if re.search(pattern, text):
            return advice
    return None
