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
script as exact tokens).

The script sees the env's task conversations only: trajcore's start-up probe (``[user: "hi"]``,
no tools, one token: ``model_probe``), which ``process`` sends before its first group, is
answered by the endpoint itself, and said on stderr. A script that raises (any exception, or a
step ``chat_turn`` cannot read) is the script's bug, never the endpoint's outage: its traceback
(the script's frames) goes to stderr, and the request is answered HTTP 400 naming the
exception and the script's line, which the env's model call reports at once, without retries,
as a refused request (the trajectory ends as ``model_error`` with that message).
"""

from __future__ import annotations

import argparse
import sys
import traceback
from collections.abc import Sequence
from typing import TextIO

import anyio

from trajcore.domain.json_values import JSONObject
from trajcore.domain.messages import Message
from trajcore.domain.sampling import ChatTurn, FinishReason
from trajcore.entrypoints.model_probe import PROBE_PROMPT, is_probe
from trajcore.entrypoints.run import load_object
from trajcore.rollout.scripted import ModelScript, chat_turn
from trajcore.testing.llm_stubs import LoopbackLLMServer, PolicyFailed

__all__ = ["main", "script_server"]

_PROBE_ANSWER = ChatTurn(message=Message.assistant(PROBE_PROMPT), finish_reason=FinishReason.LENGTH)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="trajcore model",
        description="serve a script of the model as an OpenAI-compatible endpoint on loopback",
    )
    parser.add_argument("script", help="the model as a script: module:function or file.py:function")
    parser.add_argument("--port", type=int, default=0, help="the port (default: a free one)")
    parser.add_argument("--model", default="stub-model", help="the model name answers carry")
    return parser


def _script_line(script: ModelScript, error: BaseException) -> str:
    """`` (at file:line in function)``: the innermost frame of ``error`` in the script's own
    file (else its innermost frame), or "" when it has none."""
    frames = traceback.extract_tb(error.__traceback__)
    code = getattr(script, "__code__", None)
    own = [f for f in frames if code is not None and f.filename == code.co_filename]
    if not (own or frames):
        return ""
    frame = (own or frames)[-1]
    return f" (at {frame.filename.rsplit('/', 1)[-1]}:{frame.lineno} in {frame.name})"


def script_server(
    script: ModelScript, *, name: str, model: str, log: TextIO | None = None
) -> LoopbackLLMServer:
    """The endpoint ``trajcore model`` serves (not started): ``script``'s steps as chat
    completions, trajcore's start-up probe answered without the script, and a script's
    exception told on ``log`` (default stderr) and answered 400 (see the module doc)."""

    def say(text: str) -> None:
        print(text, file=sys.stderr if log is None else log, flush=True)

    def answer(messages: Sequence[Message]) -> ChatTurn:
        try:
            return chat_turn(script(messages), messages)
        except Exception as error:  # noqa: BLE001 - the script's bug: told, then answered 400
            what = f"{type(error).__name__}: {error}" if str(error) else type(error).__name__
            told = f"the model script {name} raised {what}{_script_line(script, error)}"
            below = error.__traceback__.tb_next if error.__traceback__ else None
            lines = traceback.format_exception(type(error), error, below or error.__traceback__)
            count = f"{len(messages)} message{'' if len(messages) == 1 else 's'}"
            where = f"on a conversation of {count}; answered HTTP 400"
            say(f"trajcore model: {told}, {where}\n{''.join(lines).rstrip()}")
            raise PolicyFailed(f"trajcore model: {told}", status=400) from None

    def probe(body: JSONObject) -> ChatTurn | None:
        if not is_probe(body):
            return None
        say("trajcore model: answered trajcore's start-up probe itself (the script never sees it)")
        return _PROBE_ANSWER

    return LoopbackLLMServer(
        chat_policy=answer, chat_request_policy=probe, model=model, record=False
    )


async def _serve(script: ModelScript, name: str, port: int, model: str) -> None:
    server = script_server(script, name=name, model=model)
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
