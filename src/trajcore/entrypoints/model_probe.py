"""The start-up probe: the one-token chat request trajcore sends a model endpoint before a run.

``process``, ``serve`` and ``evaluate`` (``startup.model_probes``) and ``trajcore run`` against
an endpoint (``run.wait_for_endpoint``) first ask the endpoint for one token of a reply to
``[user: "hi"]``, with no tools and at temperature 0, to learn whether a model server answers
there. The request is defined here once, so that ``trajcore model`` (a script of the model
served as an endpoint) can tell it apart from a task's conversation and answer it itself: a
script written for the env's tasks never sees it (``is_probe``).
"""

from __future__ import annotations

from trajcore.adapters.llm.chat import OpenAIChatServer
from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.sampling import SamplingParams

__all__ = ["PROBE_PROMPT", "PROBE_SAMPLING", "is_probe", "send_probe"]

PROBE_PROMPT = "hi"
"""The probe's one user message."""

PROBE_SAMPLING = SamplingParams(max_tokens=1, temperature=0.0)
"""The probe's sampling: one token, greedy."""


async def send_probe(chat: OpenAIChatServer) -> object:
    """Send the probe through ``chat`` and return its answer.

    Raises:
        ModelServerError, ModelServerRejected, WireError: as ``OpenAIChatServer.chat``.
    """
    return await chat.chat([Message.user(PROBE_PROMPT)], tools=(), sampling=PROBE_SAMPLING)


def is_probe(body: JSONObject) -> bool:
    """Whether the chat-completions request ``body`` is the probe: one user message that is
    ``PROBE_PROMPT``, no tools, ``max_tokens`` 1. A task's conversation carries the env's tools
    or asks for more than one token, so it is never taken for the probe."""
    messages = body.get("messages")
    return (
        body.get("max_tokens") == PROBE_SAMPLING.max_tokens
        and not body.get("tools")
        and isinstance(messages, list)
        and len(messages) == 1
        and messages[0] == {"role": "user", "content": PROBE_PROMPT}
    )
