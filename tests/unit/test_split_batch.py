"""A batch too large for one request, in parts (``client.split_batch``): every call that fits a
request alone is in exactly one part, in its order, each part's body within the limit, and the
parts as few as taking calls in order allows; a call too large alone is in none, and named."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from trajcore.adapters.pools.client import split_batch
from trajcore.adapters.slot_server.codec import decode, encode
from trajcore.domain.json_values import JSON
from trajcore.domain.slot_protocol import MAX_REQUEST_BYTES, ExecuteCall, ExecuteRequest

EMPTY = len(b'{"calls":[]}')


def written(call_id: str, slot: int, content: str) -> ExecuteCall:
    arguments: dict[str, JSON] = {"path": "f", "content": content}
    return ExecuteCall(slot=slot, epoch=1, call_id=call_id, tool="write_file",
                       arguments=arguments, timeout_s=5.0)  # fmt: skip


def body_size(sizes: list[int], part: list[int]) -> int:
    """The size of ``{"calls":[...]}`` around the calls of ``part``, comma-separated."""
    return EMPTY + sum(sizes[i] for i in part) + len(part) - 1


def test_two_calls_that_fit_alone_but_not_together_go_in_two_parts() -> None:
    size = 40_000_000
    assert split_batch([size, size]) == ([[0], [1]], [])


def test_calls_that_fit_together_stay_in_one_part() -> None:
    assert split_batch([100, 200, 300]) == ([[0, 1, 2]], [])
    assert split_batch([]) == ([], [])


def test_a_call_too_large_alone_is_in_no_part_and_the_others_keep_their_order() -> None:
    limit = 100
    assert split_batch([10, limit, 20, 30], limit) == ([[0, 2, 3]], [1])
    fits = limit - EMPTY  # a call alone whose body is exactly the limit
    assert split_batch([fits, fits + 1, 1], limit) == ([[0], [2]], [1])


@given(
    sizes=st.lists(st.integers(min_value=2, max_value=300), max_size=40),
    limit=st.integers(min_value=EMPTY + 2, max_value=600),
)
def test_parts_cover_every_call_that_fits_once_in_order_within_the_limit(
    sizes: list[int], limit: int
) -> None:
    parts, too_large = split_batch(sizes, limit)
    assert too_large == [i for i, size in enumerate(sizes) if size + EMPTY > limit]
    sent = [i for part in parts for i in part]
    assert sent == [i for i in range(len(sizes)) if i not in too_large]
    for part in parts:
        assert part
        assert body_size(sizes, part) <= limit
    for part, following in itertools.pairwise(parts):  # greedy: the next did not fit
        assert body_size(sizes, [*part, following[0]]) > limit


@given(
    contents=st.lists(st.text(max_size=30), min_size=1, max_size=5),
    slots=st.lists(st.integers(min_value=0, max_value=3), min_size=5, max_size=5),
)
def test_a_parts_body_is_its_calls_encoded_one_by_one_and_joined(
    contents: list[str], slots: list[int]
) -> None:
    """What the client relies on: a part's body, the calls' own encodings joined, is the
    request of those calls, and its size is what ``split_batch`` added up."""
    pairs = enumerate(zip(contents, slots, strict=False))
    calls = [written(f"c{i}", slot, content) for i, (content, slot) in pairs]
    items = [encode(call) for call in calls]
    body = b'{"calls":[' + b",".join(items) + b"]}"
    assert decode(body, ExecuteRequest) == ExecuteRequest(calls=calls)
    sizes = [len(item) for item in items]
    assert len(body) == body_size(sizes, list(range(len(calls))))
    assert split_batch(sizes) == ([list(range(len(calls)))], [])
    assert len(body) <= MAX_REQUEST_BYTES
