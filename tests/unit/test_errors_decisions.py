"""The decisions of trajcore's errors: what each one's message reads and which facts it carries
for the code that catches it."""

from __future__ import annotations

from trajcore.domain.errors import (
    ConfigError,
    IdleLimitExceeded,
    InfrastructureError,
    InvalidInput,
    ModelServerError,
    ModelServerRejected,
    RateLimited,
    SlotFileError,
    TrajcoreError,
)


def test_bad_input_reads_reason_at_field_and_keeps_both() -> None:
    """An input error's message is ``reason @ field``, with the field and the reason kept apart
    for code that reports them."""
    error = ConfigError("sampling.temperature", "expected at most 10, got 11")
    assert str(error) == "expected at most 10, got 11 @ sampling.temperature"
    assert (error.field, error.reason) == ("sampling.temperature", "expected at most 10, got 11")


def test_bad_input_with_one_fault_lists_that_fault_as_its_problems() -> None:
    """Without a list of problems the error's one fault is its list, in the message's form."""
    error = InvalidInput("$.name", "expected string")
    assert error.problems == ("expected string @ $.name",)


def test_bad_input_with_several_faults_keeps_the_list_it_was_given() -> None:
    """A validator that collected several faults hands them all on, in its order."""
    problems = ("expected string @ $.name", "missing @ $.path")
    error = InvalidInput("$.name", "expected string", problems=problems)
    assert error.problems == problems
    assert str(error) == "expected string @ $.name"


def test_a_model_server_failure_keeps_its_http_status_when_it_had_one() -> None:
    """Retries ended on a status (a 503, or 429s for ``RateLimited``), or on no status at all
    (a dropped connection)."""
    error = ModelServerError("server error 503 after 3 attempts", status=503)
    assert (str(error), error.status) == ("server error 503 after 3 attempts", 503)
    assert ModelServerError("connection dropped").status is None
    limited = RateLimited("429 until the deadline", status=429)
    assert (str(limited), limited.status) == ("429 until the deadline", 429)
    assert isinstance(limited, InfrastructureError)


def test_a_rejected_request_keeps_the_status_and_the_servers_body() -> None:
    """A 4xx is the caller's bug: the error carries what the server said, to be read."""
    error = ModelServerRejected("400 Bad Request", status=400, body='{"error": "bad"}')
    assert (str(error), error.status, error.body) == ("400 Bad Request", 400, '{"error": "bad"}')
    assert not isinstance(error, InfrastructureError)


def test_a_slot_file_error_reads_reason_at_path_and_keeps_both() -> None:
    """A hook's failed file read names the file and why, in the input errors' form."""
    error = SlotFileError("out/result.txt", "no such file")
    assert str(error) == "no such file @ out/result.txt"
    assert (error.path, error.reason) == ("out/result.txt", "no such file")
    assert isinstance(error, TrajcoreError)
    assert not isinstance(error, InfrastructureError)


def test_an_idle_limit_error_keeps_the_limit_that_ran_out() -> None:
    """The loop reports which idle lifetime the model's turn went past."""
    error = IdleLimitExceeded("the model kept the slot idle for 31 s", limit_s=30.0)
    assert (str(error), error.limit_s) == ("the model kept the slot idle for 31 s", 30.0)
