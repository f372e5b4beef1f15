"""The README's env, kept here so mypy --strict checks it and a test keeps the two equal."""

from trajcore.env import AgentEnv, Message, SlotTools, Transcript


class HelloEnv(AgentEnv[str]):
    name = "hello"

    async def get_next_item(self) -> str:
        return "hello world"

    def build_task(self, item: str) -> list[Message]:
        return [Message.user(f"Create hello.txt containing exactly: {item}")]

    async def verify_and_score(self, item: str, tools: SlotTools, transcript: Transcript) -> float:
        # check: exit code 0 or not; a slot that cannot answer raises, so it is never a 0.
        return 1.0 if await tools.check(f'test "$(cat hello.txt)" = "{item}"') else 0.0


if __name__ == "__main__":
    HelloEnv.cli()  # python hello.py serve|process|evaluate --env.tokenizer_name ...
