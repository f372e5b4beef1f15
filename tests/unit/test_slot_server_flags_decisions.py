"""The slot-server flag codec's decisions its round-trip tests see only through argparse's usage
error (found by mutation testing): what a malformed word's ``ValueError`` says, and that a switch
takes no value."""

from __future__ import annotations

import pytest

from trajcore.domain.slot_server_flags import ISOLATION_FLAGS


def test_a_switch_read_as_a_value_says_it_takes_none() -> None:
    """Pins ``IsolationFlag.read`` on a switch: a ``ValueError`` naming the flag."""
    (switch,) = [flag for flag in ISOLATION_FLAGS if flag.name == "--allow-network"]
    with pytest.raises(ValueError, match=r"^--allow-network is a switch and takes no value$"):
        switch.read("yes")


@pytest.mark.parametrize(
    ("name", "word", "message"),
    [
        ("--extra-binds", "[1]", "expected a JSON list of objects"),
        ("--extra-binds", "{}", "expected a JSON list of objects"),
        ("--system-paths", "[1]", "expected a JSON list of paths"),
        ("--system-paths", '"/usr"', "expected a JSON list of paths"),
    ],
)
def test_a_malformed_list_says_what_was_expected(name: str, word: str, message: str) -> None:
    """Pins the reason of each list codec's refusal of a word that is JSON of another shape."""
    (flag,) = [flag for flag in ISOLATION_FLAGS if flag.name == name]
    with pytest.raises(ValueError, match=rf"^{message}$"):
        flag.read(word)
