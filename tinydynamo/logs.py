"""TINY_LOGS: per-kind logging for every layer, like TORCH_LOGS.

``TINY_LOGS=recompiles,guards python my_script.py`` turns on those kinds; each kind is a std
``logging`` logger named ``tinydynamo.<kind>`` (so ``logging`` config works too). Layers call
``get_logger(kind)`` and log at INFO; :func:`set_logs` switches kinds on from code (notebooks).
"""
from __future__ import annotations

import logging
import os
import sys

KINDS = ("graph_breaks", "guards", "recompiles", "dynamic", "bytecode", "graph_code", "output_code", "ddp_graphs")
_handler: logging.Handler | None = None


def get_logger(kind: str) -> logging.Logger:
    """The logger for one kind (``tinydynamo.<kind>``); unknown kinds are an error, to catch typos."""
    if kind not in KINDS:
        raise ValueError(f"unknown log kind {kind!r}; use one of {KINDS}")
    return logging.getLogger(f"tinydynamo.{kind}")


def set_logs(**kinds: bool) -> None:
    """Turn kinds on or off: ``set_logs(recompiles=True, guards=False)``."""
    global _handler
    if _handler is None:
        _handler = logging.StreamHandler(sys.stderr)
        _handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
    for kind, on in kinds.items():
        logger = get_logger(kind)
        logger.setLevel(logging.INFO if on else logging.WARNING)
        if on and _handler not in logger.handlers:
            logger.addHandler(_handler)
            logger.propagate = False
        elif not on and _handler in logger.handlers:
            logger.removeHandler(_handler)
            logger.propagate = True


def enabled(kind: str) -> bool:
    return get_logger(kind).isEnabledFor(logging.INFO)


def _from_env() -> None:
    wanted = [k.strip() for k in os.environ.get("TINY_LOGS", "").split(",") if k.strip()]
    unknown = [k for k in wanted if k not in KINDS]
    if unknown:
        print(f"TINY_LOGS: ignoring unknown kinds {unknown}; known: {', '.join(KINDS)}", file=sys.stderr)
    set_logs(**{k: True for k in wanted if k in KINDS})


_from_env()
