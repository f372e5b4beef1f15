"""OpenAI mode's final re-render of a long conversation, against one render of it, with Qwen3's
real template.

Run: ``.venv/bin/python -m bench.rerender [--turns 40] [--chars 400000] [--repeats 3]``

An agent conversation of ``--turns`` tool-calling turns whose tool results hold ``--chars``
characters in all is re-rendered into training tokens (``ChatTemplate.rerender``, what
``ChatPolicy``'s session does when a trajectory ends). The limit measured in the same run is
ONE render of the whole conversation (``Tokenizer.render``: the template and the tokenizer,
once); the figure is the re-render's time as a multiple of it (target: at most 4x).

Rows: ``one query`` (a user query, then tool calls only: Qwen3 writes every prefix as the whole
begins) and ``a query every 5 turns`` (Qwen3 drops the reasoning of turns before the latest user
query, so a prefix ending before a later query differs from the whole early on: the adapter
then copies the ids of that prefix's later stretches between added tokens from the whole's,
and encodes only the stretches the whole lacks). Each row also prints, once, the re-render
with every prefix rendered whole (the algorithm before the adapter measured prefixes itself,
still used for renderers that cannot) and checks that both give the same segments. Nothing is
estimated: every figure is measured in this run.
"""

from __future__ import annotations

import argparse
import random
import statistics
import time
from collections.abc import Callable
from functools import partial

from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.messages import Message
from trajcore.domain.token_ledger.template import ChatTemplate, RenderOnly
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult, ToolSpec

TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a shell command in the sandbox.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    ),
)
_WORDS = ("def", "class", "return", "import", "self", "value", "error", "file", "line", "the")


def _output(rng: random.Random, size: int) -> str:
    lines: list[str] = []
    total = 0
    while total < size:
        line = " ".join(rng.choice(_WORDS) for _ in range(12))
        lines.append(line)
        total += len(line) + 1
    return "\n".join(lines)[:size]


def conversation(turns: int, chars: int, *, query_every: int | None) -> list[Message]:
    """A system prompt, a query, ``turns`` tool-calling turns (each with reasoning) whose
    results hold ``chars`` characters in all, a user query every ``query_every`` turns, and a
    final answer."""
    rng = random.Random(0)
    messages = [Message.system("You are a careful agent."), Message.user("Fix the failing test.")]
    for turn in range(turns):
        if query_every and turn and turn % query_every == 0:
            messages.append(Message.user(f"Keep going; look at file {turn} next."))
        call = ToolCall(id=f"call{turn}", name="bash", arguments={"command": f"cat src/{turn}.py"})
        messages.append(
            Message.assistant(f"Reading {turn}.", tool_calls=[call], reasoning=f"File {turn}?")
        )
        content = _output(rng, chars // turns)
        result = ToolResult(call_id=call.id, name="bash", outcome=ToolOutcome.OK, content=content)
        messages.append(Message.tool(result))
    return [*messages, Message.assistant("The test passes now.")]


def _median_s(work: Callable[[], object], repeats: int) -> float:
    times: list[float] = []
    for _ in range(repeats):
        began = time.perf_counter()
        work()
        times.append(time.perf_counter() - began)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=40)
    parser.add_argument("--chars", type=int, default=400_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    tokenizer = TransformersTokenizer.from_path(qwen3_tokenizer_path())
    template = ChatTemplate.learn(tokenizer, turn_stops=[tokenizer.eos_token_id or 0])
    whole = ChatTemplate(renderer=RenderOnly(tokenizer), shape=template.shape)
    print(f"OpenAI-mode re-render, Qwen3, {args.turns} turns, {args.chars:,} characters of results")
    for label, every in (("one query", None), ("a query every 5 turns", 5)):
        messages = conversation(args.turns, args.chars, query_every=every)
        tokenizer.render(messages, tools=TOOLS)  # warm: the template compiled
        one = _median_s(partial(tokenizer.render, messages, tools=TOOLS), args.repeats)
        fast = _median_s(partial(template.rerender, messages, tools=TOOLS), args.repeats)
        began = time.perf_counter()
        slow_ledger = whole.rerender(messages, tools=TOOLS)
        slow = time.perf_counter() - began
        same = template.rerender(messages, tools=TOOLS).segments == slow_ledger.segments
        print(
            f"  {label:<22} one render {one:6.2f} s | re-render {fast:6.2f} s = "
            f"{fast / one:5.1f}x one render (target <= 4x) | each prefix whole {slow:6.2f} s "
            f"= {slow / one:5.1f}x | same segments: {same}"
        )


if __name__ == "__main__":
    main()
