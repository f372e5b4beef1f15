"""``serve``'s failures against the trainer's API (``run-api``) said for what they are: a
refusal (HTTP 4xx) is run-api up and refusing the env's request, not run-api unreachable."""

from __future__ import annotations

import aiohttp
import anyio
import pytest
import tenacity
from multidict import CIMultiDict, CIMultiDictProxy
from yarl import URL

from trajcore.entrypoints.atropos.trainer_api import TrainerApiUnavailable, explained

URL_GIVEN = "http://127.0.0.1:8000"


def _exhausted(error: BaseException) -> tenacity.RetryError:
    attempt = tenacity.Future(attempt_number=3)
    attempt.set_exception(error)
    return tenacity.RetryError(attempt)


def _refused(status: int, reason: str) -> aiohttp.ClientResponseError:
    request = aiohttp.RequestInfo(
        URL(f"{URL_GIVEN}/register-env"), "POST", CIMultiDictProxy(CIMultiDict())
    )
    return aiohttp.ClientResponseError(request, (), status=status, message=reason)


def _raised(error: BaseException) -> TrainerApiUnavailable:
    async def loop() -> None:
        raise _exhausted(error)

    with pytest.raises(TrainerApiUnavailable) as raised:
        anyio.run(explained(loop, URL_GIVEN))
    return raised.value


def test_a_refused_request_says_run_api_is_up_and_what_it_refused() -> None:
    message = str(_raised(_refused(422, "Unprocessable Entity")))
    assert f"the trainer's API at {URL_GIVEN} is up but refused the env's request" in message
    assert "POST /register-env: HTTP 422 Unprocessable Entity" in message
    assert "could not be reached" not in message


def test_an_unreachable_run_api_is_said_to_be_unreachable() -> None:
    message = str(_raised(ConnectionRefusedError(111, "Connection refused")))
    assert f"the trainer's API at {URL_GIVEN} could not be reached or kept failing" in message


def test_a_server_error_is_a_failing_run_api() -> None:
    message = str(_raised(_refused(503, "Service Unavailable")))
    assert "could not be reached or kept failing" in message
    assert "503" in message


def test_any_other_error_passes_as_it_is() -> None:
    async def loop() -> None:
        raise _exhausted(ValueError("not the API's"))

    with pytest.raises(tenacity.RetryError):
        anyio.run(explained(loop, URL_GIVEN))
