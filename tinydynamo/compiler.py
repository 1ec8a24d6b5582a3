"""``torch.compiler``-style names (where torch has moved them from ``torch._dynamo``)."""
from tinydynamo.api import allow_in_graph, is_compiling  # noqa: F401
from tinydynamo.backends import list_backends  # noqa: F401
from tinydynamo.eval_frame import compile, disable, reset  # noqa: F401

is_dynamo_compiling = is_compiling
