"""The exec agent's own JSON encoder: what the slot server decodes is what the agent meant.

The agent writes its answers with a small encoder (importing ``json`` would cost milliseconds of
every sandbox start); these properties pin it to the standard decoder.
"""

from __future__ import annotations

import json
import math
import os
import sys

from hypothesis import given
from hypothesis import strategies as st

from trajcore.adapters.sandbox.exec_agent import _json, run_exec

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(),
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(st.text(), inner, max_size=5),
    max_leaves=20,
)


@given(json_values)
def test_the_standard_decoder_reads_back_what_the_agent_encodes(value: object) -> None:
    assert json.loads(_json(value)) == value


@given(st.text())
def test_encoded_strings_are_valid_utf8_json_whatever_they_hold(text: str) -> None:
    wire = _json({"stdout": text}).encode("utf-8", "replace")
    decoded = json.loads(wire)["stdout"]
    assert decoded == text.encode("utf-8", "replace").decode("utf-8")


def test_non_finite_numbers_become_null_and_tuples_arrays() -> None:
    assert json.loads(_json([math.nan, math.inf, -math.inf, (1, 2)])) == [None, None, None, [1, 2]]


def test_run_exec_reports_exit_code_streams_and_timeout() -> None:
    done = run_exec(["/bin/sh", "-c", "printf out; printf err >&2; exit 3"], 10.0, 1024)
    assert (done["exit"], done["stdout"], done["stderr"], done["timed_out"]) == (
        3,
        "out",
        "err",
        False,
    )
    slow = run_exec(["/bin/sh", "-c", "sleep 5"], 0.2, 1024)
    assert slow["timed_out"] is True
    assert slow["signal"] == 9


def test_a_command_leads_its_own_session_unless_asked_to_stay_in_the_agents() -> None:
    ids = "import os; print(os.getpid(), os.getsid(0), os.getpgid(0))"
    python = sys.executable
    own = run_exec([python, "-c", ids], 10.0, 4096)
    pid, sid, pgid = map(int, str(own["stdout"]).split())
    assert sid == pid == pgid  # a session of its own
    kept = run_exec([python, "-c", ids], 10.0, 4096, own_session=False)
    pid, sid, pgid = map(int, str(kept["stdout"]).split())
    assert sid == os.getsid(0)  # the caller's session, so the caller can end what it leaves
    assert pgid == pid  # a group of its own, so a timeout kills the command's group only
