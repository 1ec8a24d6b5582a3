"""Errors tinydynamo raises: why a frame could not be captured, said precisely."""
from __future__ import annotations


class TinyDynamoError(RuntimeError):
    """Base class of tinydynamo's errors."""


class Unsupported(TinyDynamoError):
    """A construct the symbolic interpreter cannot capture (yet); the frame runs eagerly instead.

    ``reason`` is the short cause; ``user_stack`` the user's source lines (file:line + text) at the
    point of failure, filled in (innermost first) as the error leaves each translator; printed
    outermost first, like a traceback.
    """

    def __init__(self, reason: str, hint: str | None = None, skip_frame: bool = False):
        super().__init__(reason)
        self.reason = reason
        self.hint = hint
        self.user_stack: list[str] = []
        # no resuming after this break: the instruction must run in the frame's own code (it reads
        # the frame's locals), so the frame runs natively, its calls compiled (TorchDynamo's name)
        self.skip_frame = skip_frame

    def __str__(self) -> str:
        lines = [self.reason]
        if self.user_stack:
            lines.append("  from user code:")
            lines.extend("    " + frame.replace("\n", "\n    ") for frame in reversed(self.user_stack))
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)


def unimplemented(reason: str, hint: str | None = None, skip_frame: bool = False):
    """Raise :class:`Unsupported` (reads well at call sites: ``unimplemented("print()")``)."""
    raise Unsupported(reason, hint, skip_frame)


class ObservedException(Unsupported):
    """A Python exception that the traced code itself raises at trace time (a missing dict key, a missing
    attribute, a ``raise`` of a constant exception). A ``try``/``except`` around it in traced code catches it
    (the translator follows the code's exception table, as CPython would); uncaught, it is Unsupported."""

    def __init__(self, exc_type: type, message: str = ""):
        super().__init__(f"Observed exception: {exc_type.__name__} raised in traced code: {message}")
        self.exc_type = exc_type
        self.message = message


def raise_observed(exc_type: type, message: str = ""):
    raise ObservedException(exc_type, message)


def raise_folded(error: Exception, what: str):
    """A call folded at trace time (on constants, as eager makes it) raised ``error``: a builtin exception
    is the traced code's own (``1 / 0`` in a ``try`` is caught by its ``except``); any other kind is
    Unsupported, so that the call runs natively and raises there."""
    if type(error).__module__ == "builtins" and isinstance(error, Exception):
        observed = ObservedException(type(error), str(error))
        observed.real_args = error.args  # what ``e.args`` reads
        raise observed
    unimplemented(f"{what} raised {error!r} at trace time")


class EagerFallbackWarning(UserWarning):
    """Code the user asked to compile runs eagerly instead: a frame or graph that failed to compile,
    a frame past its recompile limit, a module whose wrapper hides its forward. Right, but not
    compiled; ``warnings.simplefilter("error", EagerFallbackWarning)`` makes each one an error."""


class BackendCompilerFailed(TinyDynamoError):
    """The backend raised while compiling a captured graph (torch._dynamo's exception of that name).

    ``stage`` is the compile phase that raised (``decompose``, ``joint_graph``, ``partition``,
    ``codegen``...: the innermost ``dynamo_timed`` block), ``inner_exception`` the error itself.
    """

    def __init__(self, backend_name: str, inner_exception: BaseException):
        self.backend_name = backend_name
        self.inner_exception = inner_exception
        self.stage = getattr(inner_exception, "tiny_stage", None) or "backend_compile"
        super().__init__(f"backend={backend_name!r} raised in stage {self.stage!r}: "
                         f"{type(inner_exception).__name__}: {inner_exception}")
