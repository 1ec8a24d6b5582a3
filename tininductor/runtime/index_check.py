"""Bounds checks of indirect indices, done inside kernels (never as extra ops in the wrapper).

``ops.indirect_indexing(value, size, check=True)`` makes each backend check the index where it
is used: Triton with ``tl.device_assert`` (kernels that check are compiled with ``debug=True``;
on a GPU a failure is a device-side assert, as in eager on CUDA), C++ with ``tiny_check_index``
(codegen/cpp_prelude.h), which records the first bad index for the runner to raise. Either way
the host never synchronises to look at indices, and no kernel reads outside its tensor.
"""
from __future__ import annotations

import contextlib
import dataclasses
import re

#: the message Triton kernels assert with (the launcher turns the interpreter's AssertionError
#: carrying it into IndexOutOfBounds)
ASSERT_MESSAGE = "index out of bounds: 0 <= {var} < {size}"
_ASSERT_RE = re.compile(r"index out of bounds: 0 <= \w+ < \d+")


class IndexOutOfBounds(IndexError, RuntimeError):
    """An indirect index out of range, found inside a kernel. Eager raises IndexError for
    embedding and advanced indexing and RuntimeError for gather/scatter: this is both."""


@contextlib.contextmanager
def interpreter_asserts():
    """Turn ``tl.device_assert`` on in Triton's interpreter (its builder ignores asserts unless its
    options say debug) for one launch, and raise IndexOutOfBounds for a failed bounds check."""
    try:
        from triton.runtime import interpreter  # optional, and slow to import: CPU runs only
    except ImportError:
        yield
        return
    builder = interpreter.interpreter_builder
    saved = builder.options

    builder.options = dataclasses.replace(saved, debug=True, sanitize_overflow=False)
    try:
        yield
    except Exception as e:  # the interpreter may wrap the AssertionError
        found = _ASSERT_RE.search(str(e))
        if found is None:
            raise
        raise IndexOutOfBounds(found.group(0)) from None
    finally:
        builder.options = saved
