"""trajcore: reinforcement-learning rollouts for LLM agents that use tools.

``from trajcore import AgentEnv, Message, SlotTools`` gives an env author's names (the list is
``trajcore.env.__all__``). They are loaded lazily, on first use (PEP 562), so ``import
trajcore.domain`` stays cheap and pure: no HTTP clients, no tokenizers, no atroposlib.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"

if TYPE_CHECKING:
    # Type checkers see the names where ``trajcore.env`` states them, and from there their homes.
    from trajcore.env import *  # noqa: F403
    from trajcore.env import __all__ as __all__


def __getattr__(name: str) -> object:
    """Load ``__all__`` and an env author's names from ``trajcore.env`` on first use.

    Other private and dunder names are refused without loading it, so that probing the package
    (``hasattr(trajcore, "__wrapped__")``) keeps it light.
    """
    if name.startswith("_") and name != "__all__":
        raise AttributeError(f"module 'trajcore' has no attribute {name!r}")
    env = importlib.import_module("trajcore.env")
    if name == "__all__":
        value: object = list(env.__all__)
    elif name in env.__all__:
        value = getattr(env, name)
    else:
        raise AttributeError(f"module 'trajcore' has no attribute {name!r}")
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *importlib.import_module("trajcore.env").__all__})
