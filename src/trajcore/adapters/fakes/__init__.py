"""Fakes: shipped, typed, in-memory implementations of every port, for tests and notebooks.

They pass the same contract suites as the real adapters and add inspection (what was sent, what
ran where) and fault injection (errors, hangs, crashes, slow starts). By port: ``llm`` (the chat
and token servers), ``sandbox`` (the sandbox pool and its workspace), ``tools`` (the external
tool server) and ``unisolated`` (a pool that runs real commands without isolation).

An env author imports them from the facade ``trajcore.testing``::

    from trajcore.testing import FakeChatServer, FakeSandboxPool, FakeTokenServer
"""
