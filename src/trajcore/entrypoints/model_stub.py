"""``trajcore model SCRIPT``: an OpenAI-compatible endpoint on loopback that answers with a
script of the model, so that an env's Atropos ``process`` (and ``serve``) mode runs end to end
with no model at all.

    trajcore model my_env.py:solve [--port N] [--model NAME]

``SCRIPT`` is the same script ``trajcore run --policy`` takes (``module:function`` or
``path.py:function``; ``trajcore.rollout.scripted.ModelScript``: the conversation so far in, the
model's next step out: tool calls, a final text or a ``Message``). The endpoint listens on
127.0.0.1 (``--port``, else a free port), prints its base URL on stdout (one line, for scripts)
and says on stderr what it serves, then answers ``POST /v1/chat/completions`` with the script's
step for the conversation the request carries, until SIGINT or SIGTERM. Point an env at it:

    python my_env.py process --openai.base_url URL --openai.model_name NAME --env.use_wandb false

It serves chat completions only, so the env runs in OpenAI mode (the token endpoints a managed
mode needs are not scripted here; ``trajcore run --policy ... --set mode=managed`` samples a
script as exact tokens). A step the script cannot give (it raises ``InvalidInput``, ``KeyError``,
``TypeError`` or ``ValueError``) is answered 400 with the reason, which the env's model call
reports as a refused request.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

import anyio

from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn
from trajcore.entrypoints.run import load_object
from trajcore.rollout.scripted import ModelScript, chat_turn
from trajcore.testing.llm_stubs import LoopbackLLMServer

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trajcore model",
        description="serve a script of the model as an OpenAI-compatible endpoint on loopback",
    )
    parser.add_argument("script", help="the model as a script: module:function or file.py:function")
    parser.add_argument("--port", type=int, default=0, help="the port (default: a free one)")
    parser.add_argument("--model", default="stub-model", help="the model name answers carry")
    return parser


async def _serve(script: ModelScript, name: str, port: int, model: str) -> None:
    def answer(messages: Sequence[Message]) -> ChatTurn:
        return chat_turn(script(messages), messages)

    server = LoopbackLLMServer(chat_policy=answer, model=model, record=False)
    await server.start(port)
    url = f"http://127.0.0.1:{server.port}/v1"
    print(url, flush=True)
    print(
        f"trajcore model: {name} answers chat completions at {url} (model {model!r}); "
        "Ctrl-C to stop",
        file=sys.stderr,
        flush=True,
    )
    try:
        await anyio.sleep_forever()
    finally:
        with anyio.CancelScope(shield=True):
            await server.aclose()


def main(argv: Sequence[str] | None = None) -> int:
    """``trajcore model``; returns the exit status (2: a script or port that cannot be used)."""
    args = _parser().parse_args(argv)
    if not 0 <= args.port <= 65535:
        print(f"trajcore model: --port {args.port}: must be 0-65535", file=sys.stderr)
        return 2
    try:
        script = load_object(args.script)
    except Exception as error:  # noqa: BLE001 - the user's file failed to load: said in one line
        print(f"trajcore model: {args.script}: {error}", file=sys.stderr)
        return 2
    if not callable(script):
        print(f"trajcore model: {args.script}: not a function of the conversation", file=sys.stderr)
        return 2
    try:
        anyio.run(_serve, script, args.script, args.port, args.model)
    except OSError as error:
        print(f"trajcore model: cannot listen on port {args.port}: {error}", file=sys.stderr)
        return 2
    return 0
