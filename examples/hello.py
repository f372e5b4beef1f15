"""The README's env, kept here so mypy --strict checks it and a test keeps the two equal."""

from collections.abc import Sequence

from trajcore.env import AgentEnv, Message, SlotTools, ToolCall, Transcript


class HelloEnv(AgentEnv[str]):
    name = "hello"

    async def get_next_item(self) -> str:
        return "hello world"

    def build_task(self, item: str) -> list[Message]:
        return [Message.user(f"Create hello.txt containing exactly: {item}")]

    async def verify_and_score(self, item: str, tools: SlotTools, transcript: Transcript) -> float:
        # check: exit code 0 or not; a slot that cannot answer raises, so it is never a 0.
        return 1.0 if await tools.check(f'test "$(cat hello.txt)" = "{item}"') else 0.0


def solve(messages: Sequence[Message]) -> str | list[ToolCall]:
    """A script of the model: `trajcore run hello.py:HelloEnv --policy solve`."""
    if any(message.role == "tool" for message in messages):
        return "Done."
    return [
        ToolCall(
            id="w", name="write_file", arguments={"path": "hello.txt", "content": "hello world"}
        )
    ]


if __name__ == "__main__":
    HelloEnv.cli()  # python hello.py serve|process|evaluate --env.tokenizer_name ...
