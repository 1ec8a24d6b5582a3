"""Example functions whose bytecode chapter 1 compares across CPython versions.

Torch-free on purpose (``torch`` is only a global name here, never imported), so the listings
can be produced by interpreters that have no torch installed: compiling a function does not
need its globals to exist.
"""


def add_relu(x, y):
    return torch.relu(x + y)  # noqa: F821


def sum_keepdim(x):
    return x.sum(dim=1, keepdim=True)


def scale_if_big(x, n):
    if n > 2:
        return x * n
    return 0


def running_sum(xs):
    total = 0
    for x in xs:
        total = total + x
    return total


def squares(xs):
    return [x * x for x in xs]
