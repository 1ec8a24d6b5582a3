"""Wrong answers to chapter 2 (the symbolic interpreter's opcode handlers)."""
from course.mutants import Mutant

MUTANTS = [
    Mutant("2.1", "operands swapped: pushes b <op> a",
           "BuiltinVariable.binop(tx, bc.BINARY_OPS[inst.argval], a, b)",
           "BuiltinVariable.binop(tx, bc.BINARY_OPS[inst.argval], b, a)"),
    Mutant("2.1", "reads the right operand without popping it", "b = tx.pop()", "b = tx.stack[-1]"),
    Mutant("2.1", "pops the operands in the wrong order", "b = tx.pop()\n    a = tx.pop()", "a = tx.pop()\n    b = tx.pop()"),
    Mutant("2.1", "applies the operator to the variables themselves, not through binop",
           "tx.push(BuiltinVariable.binop(tx, bc.BINARY_OPS[inst.argval], a, b))", "tx.push(bc.BINARY_OPS[inst.argval](a, b))"),
    Mutant("2.2", "reads the condition without popping it", "value = tx.pop()", "value = tx.stack[-1]"),
    Mutant("2.2", "jumps on the opposite truth value", "value.truth(tx) == jump_when", "value.truth(tx) != jump_when"),
    Mutant("2.2", "tests the Python truth of the variable object, not of its value",
           "value.truth(tx) == jump_when", "bool(value) == jump_when"),
    Mutant("2.2", "jumps one instruction too far", "tx.ip = inst.target", "tx.ip = inst.target + 1"),
    Mutant("2.3", "keyword arguments taken from the front of the arguments",
           "kwargs = dict(zip(inst.kw_names, args[len(args) - n_kw:]))", "kwargs = dict(zip(inst.kw_names, args[:n_kw]))"),
    Mutant("2.3", "forgets the leading argument (self) from the call slots",
           "positional = lead + args[: len(args) - n_kw]", "positional = args[: len(args) - n_kw]"),
    Mutant("2.3", "call slots read in the wrong order",
           "bc.resolve_call_slots(slot0, slot1, lambda v: v is NULL)", "bc.resolve_call_slots(slot1, slot0, lambda v: v is NULL)"),
    Mutant("2.3", "pops only one call slot", "    slot0 = tx.pop()\n", "    slot0 = tx.stack[-1]\n"),
    Mutant("2.4", "leaves the iterator on the stack at the loop's end", "        tx.pop()\n        tx.ip", "        tx.ip"),
    Mutant("2.4", "does not jump past the loop when exhausted", "        tx.ip = inst.target\n", "        pass\n"),
    Mutant("2.4", "pops the iterator on every step", "        tx.push(item)", "        tx.pop()\n        tx.push(item)"),
]
