"""Readable Python for generated code objects (resume functions), for the instructor's view.

A resume function exists only as bytecode (tinydynamo.resume assembles it), so to read it we
decompile it with the maintained ``depyf`` package, as PyTorch's own debugging tools do for
TorchDynamo's transformed code. Where depyf is missing or cannot handle a code object (a new
CPython, an unusual jump), the view falls back to the ``dis`` listing, commented out so the
text is still a valid Python file, with a note saying why.
"""
from __future__ import annotations

import dis
import types


def decompile(code: types.CodeType) -> str:
    """Python source for ``code`` (via depyf), else its commented ``dis`` listing with the reason."""
    try:
        import depyf

        source = depyf.decompile(code)
        compile(source, f"<decompiled {code.co_name}>", "exec")  # never hand out text that does not parse
        return source
    except Exception as e:  # ImportError, or depyf's own failure on this code object
        listing = dis.Bytecode(code).dis()
        note = f"depyf could not decompile {code.co_name} ({type(e).__name__}: {e}); its bytecode instead:"
        return "\n".join(["# " + note] + ["# " + line for line in listing.splitlines()]) + "\n"
