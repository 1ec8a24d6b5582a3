"""Assertions for graded tests whose failures read "yours vs expected".

The score table (``python -m course.grade``) shows the first line of the failure, so the
first line says what differs; later lines give the detail (the bytecode, graph or kernel).
"""
from __future__ import annotations

from typing import Any


class Mismatch(AssertionError):
    """A graded check failed: the learner's value differs from the reference."""


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    if hasattr(value, "shape") and hasattr(value, "dtype"):  # a tensor: summarise, don't dump
        text = f"tensor(shape={tuple(value.shape)}, dtype={value.dtype})"
    return text if len(text) <= limit else text[: limit - 3] + "..."


def expect_equal(yours: Any, expected: Any, what: str, context: str = "") -> None:
    """Fail with ``what: yours X vs expected Y`` unless ``yours == expected``."""
    if yours != expected:
        message = f"{what}: yours {_short(yours)} vs expected {_short(expected)}"
        raise Mismatch(message + (f"\n{context}" if context else ""))


def expect_close(yours: Any, expected: Any, what: str, context: str = "", **tolerances) -> None:
    """Compare tensors (or nested tuples/lists of them) with ``torch.testing.assert_close``."""
    import torch

    try:
        torch.testing.assert_close(yours, expected, **tolerances)
    except (AssertionError, TypeError, ValueError) as error:
        detail = str(error).strip().splitlines()
        first = next((line for line in detail if line.strip()), "values differ")
        message = f"{what}: yours vs expected differ: {first.strip()}"
        rest = "\n".join(detail[1:])
        raise Mismatch("\n".join(part for part in (message, rest, context) if part)) from None


def expect_true(condition: bool, what: str, context: str = "") -> None:
    """Fail with ``what`` unless ``condition`` holds (for properties with no single expected value)."""
    if not condition:
        raise Mismatch(what + (f"\n{context}" if context else ""))
