"""Ledger cost per turn early and late in one long conversation, with Qwen3's real template.

Run: ``.venv/bin/python -m bench.llm_ledger [--turns 256] [--repeats 7]``

One managed-mode conversation of ``--turns`` tool-calling turns is played through a
``TokenLedger``: each turn appends a sampled completion (the ids Qwen3 would write for a tool
call, with logprobs), bridges a tool result with ``ChatTemplate.append_environment`` and takes
``prompt_ids()`` for the next request -- the ledger work the rollout does per turn. The whole
conversation is played ``--repeats`` times; the figure for a turn is the median over repeats.

It prints the time per turn at turn 8 and at the last turn, and their ratio (target: at most
1.5, i.e. a turn costs about the same however long the conversation is). For contrast it also
prints what a full re-render of the conversation costs at those turns, which is what a ledger
that re-encoded history would pay. Nothing is estimated: every figure is measured in this run.
"""

from __future__ import annotations

import argparse
import statistics
import time

from trajcore.adapters.tokenizers import TransformersTokenizer, qwen3_tokenizer_path
from trajcore.domain.messages import Message
from trajcore.domain.sampling import FinishReason, TokenCompletion
from trajcore.domain.token_ledger.template import ChatTemplate
from trajcore.domain.tools import ToolCall, ToolOutcome, ToolResult, ToolSpec

TOOLS = (
    ToolSpec(
        name="bash",
        description="Run a shell command in the sandbox.",
        parameters={"type": "object", "properties": {"command": {"type": "string"}}},
    ),
)


def _turn_messages(turn: int) -> tuple[Message, Message]:
    call = ToolCall(id=f"call{turn}", name="bash", arguments={"command": f"cat notes/{turn}.txt"})
    assistant = Message.assistant(
        f"Reading note {turn}.", tool_calls=[call], reasoning=f"Note {turn} may hold the answer."
    )
    result = ToolResult(
        call_id=call.id,
        name="bash",
        outcome=ToolOutcome.OK,
        content=f"note {turn}: nothing here yet, keep looking in the next file.",
    )
    return assistant, Message.tool(result)


def play(
    tokenizer: TransformersTokenizer, template: ChatTemplate, turns: int
) -> tuple[list[float], int]:
    """Seconds of ledger work for each turn, and the final ledger length."""
    messages = [Message.system("You are a careful agent."), Message.user("Find the answer.")]
    ledger = template.start(messages, tools=TOOLS)
    # The sampled ids: what Qwen3 writes for the turn (computed outside the timed region).
    samples: list[tuple[list[int], Message]] = []
    for turn in range(1, turns + 1):
        assistant, tool = _turn_messages(turn)
        text = tokenizer.render_text([Message.user("x"), assistant])
        start = text.rindex("<|im_start|>assistant\n") + len("<|im_start|>assistant\n")
        samples.append((tokenizer.encode(text[start:].removesuffix("\n")), tool))
    seconds: list[float] = []
    for ids, tool in samples:
        completion = TokenCompletion.of(ids, [-0.25] * len(ids), FinishReason.STOP)
        begin = time.perf_counter()
        ledger.append_completion(completion)
        template.append_environment(ledger, [tool])
        ledger.prompt_ids()
        seconds.append(time.perf_counter() - begin)
    return seconds, len(ledger)


def full_render_seconds(tokenizer: TransformersTokenizer, turns: int, repeats: int) -> float:
    """Median seconds to re-render a conversation of ``turns`` turns in full."""
    messages = [Message.system("You are a careful agent."), Message.user("Find the answer.")]
    for turn in range(1, turns + 1):
        messages.extend(_turn_messages(turn))
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        tokenizer.render(messages, tools=TOOLS, add_generation_prompt=True)
        times.append(time.perf_counter() - begin)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--turns", type=int, default=256)
    parser.add_argument("--early", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args()
    if not 1 <= args.early <= args.turns:
        parser.error("--early must be between 1 and --turns")

    tokenizer = TransformersTokenizer.from_path(qwen3_tokenizer_path())
    template = ChatTemplate.learn(tokenizer, turn_stops=[tokenizer.eos_token_id or 0])
    play(tokenizer, template, min(args.turns, 16))  # warm-up: template compilation, caches

    runs = [play(tokenizer, template, args.turns) for _ in range(args.repeats)]
    early = statistics.median(run[0][args.early - 1] for run in runs)
    late = statistics.median(run[0][args.turns - 1] for run in runs)
    length = runs[0][1]
    ratio = late / early

    print(f"Qwen3 template, {args.turns} turns, {args.repeats} repeats, final ledger {length} ids")
    print(f"ledger time per turn at turn {args.early:>4}: {early * 1e6:9.1f} us")
    print(f"ledger time per turn at turn {args.turns:>4}: {late * 1e6:9.1f} us")
    print(f"ratio late/early: {ratio:.2f} (target <= 1.5: {'met' if ratio <= 1.5 else 'NOT met'})")
    full_early = full_render_seconds(tokenizer, args.early, args.repeats)
    full_late = full_render_seconds(tokenizer, args.turns, args.repeats)
    print(
        f"for contrast, a full re-render: {full_early * 1e6:.1f} us at turn {args.early}, "
        f"{full_late * 1e6:.1f} us at turn {args.turns} (ratio {full_late / full_early:.1f})"
    )


if __name__ == "__main__":
    main()
