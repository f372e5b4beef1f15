"""Which signal after the first forces the end (``trajcore.entrypoints.signals``): a SIGTERM sent
again at once is the same request (GNU ``timeout`` sends it to the env and then to its process
group); a later SIGTERM, or a second SIGINT (a double Ctrl-C), forces. Time is a fake clock."""

from __future__ import annotations

import signal
from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import pytest

from trajcore.entrypoints.signals import REPEAT_WINDOW_S, Interrupted, _Shutdown


class Forced(Exception):
    """The shutdown forced the end (instead of the process's exit) with ``status``."""

    def __init__(self, status: int) -> None:
        super().__init__(status)
        self.status = status


def _forced(status: int) -> NoReturn:
    raise Forced(status)


@contextmanager
def _shutdown(times: list[float]) -> Iterator[_Shutdown]:
    clock = iter(times)
    shutdown = _Shutdown(name="Env", grace_s=3600.0, clock=lambda: next(clock), end=_forced)
    try:
        yield shutdown
    finally:
        shutdown.cancel()


def _first(shutdown: _Shutdown, signum: int) -> None:
    with pytest.raises(Interrupted):  # no event loop runs here: it stops where it is
        shutdown.handle(signum, None)


def test_a_sigterm_sent_again_within_the_window_changes_nothing(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with _shutdown([0.0, 0.001, REPEAT_WINDOW_S / 2]) as shutdown:
        _first(shutdown, signal.SIGTERM)
        shutdown.handle(signal.SIGTERM, None)
        shutdown.handle(signal.SIGTERM, None)
    said = capsys.readouterr().err.splitlines()
    assert said == [
        "Env: SIGTERM: stopping and closing the sandbox pool (send it again a second later to stop "
        "at once)"
    ]


@pytest.mark.parametrize(
    ("first", "then", "after_s", "status"),
    [
        (signal.SIGTERM, signal.SIGTERM, REPEAT_WINDOW_S, 143),
        (signal.SIGINT, signal.SIGINT, 0.001, 130),
        (signal.SIGINT, signal.SIGTERM, 0.001, 143),
        (signal.SIGTERM, signal.SIGINT, 0.001, 130),
    ],
    ids=["sigterm_later", "double_ctrl_c", "sigint_then_sigterm", "sigterm_then_sigint"],
)
def test_any_other_second_signal_forces_the_end(
    capsys: pytest.CaptureFixture[str], first: int, then: int, after_s: float, status: int
) -> None:
    with _shutdown([0.0, after_s]) as shutdown:
        _first(shutdown, first)
        with pytest.raises(Forced) as forced:
            shutdown.handle(then, None)
        assert forced.value.status == status
    assert (
        "Env: a second signal: ending the slot servers and stopping now" in capsys.readouterr().err
    )
