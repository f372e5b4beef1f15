"""The decisions of leases over task environments, from the env's side: what a refusal says and
carries, and which references pass the check made before a slot is leased."""

from __future__ import annotations

import pytest

from trajcore.domain.environment_leases import (
    EnvironmentUnavailable,
    ForkRefused,
    ServerFigureBook,
    ServerFigures,
    ServerTotals,
    check_environment,
)
from trajcore.domain.errors import InfrastructureError
from trajcore.domain.task_environments import ImageCacheStatistics


def test_an_unavailable_environment_names_the_image_the_reason_and_the_field() -> None:
    """The field is ``environment`` unless the refusal is about something else."""
    error = EnvironmentUnavailable("oci:/img", "no image cache")
    assert str(error) == "task environment oci:/img: no image cache @ environment"
    assert (error.environment, error.reason, error.field) == (
        "oci:/img",
        "no image cache",
        "environment",
    )
    error = EnvironmentUnavailable("oci:/img", "not set", field="image_cache_dir")
    assert str(error) == "task environment oci:/img: not set @ image_cache_dir"
    assert error.field == "image_cache_dir"
    assert isinstance(error, InfrastructureError)


def test_a_refused_fork_says_why_as_a_word_and_in_the_servers_words() -> None:
    error = ForkRefused("no_slots", "no slot of c1 came free in 5 s")
    assert str(error) == "fork refused (no_slots): no slot of c1 came free in 5 s"
    assert (error.reason, error.detail) == ("no_slots", "no slot of c1 came free in 5 s")
    assert isinstance(error, InfrastructureError)


@pytest.mark.parametrize(
    "reference", ["oci:/images/a", "oci:/images/a:v1", "containers-storage:alpine"]
)
def test_a_well_formed_reference_passes_the_check_as_it_was_given(reference: str) -> None:
    assert check_environment(reference) == reference


def test_a_reference_that_is_not_text_is_unavailable_naming_the_field() -> None:
    """The refusal keeps the reference as text, the parser's reason and the field it was
    given (``environment`` unless the caller names another)."""
    with pytest.raises(EnvironmentUnavailable) as caught:
        check_environment(7)
    assert (caught.value.environment, caught.value.reason, caught.value.field) == (
        "7",
        "must be text, got int",
        "environment",
    )
    with pytest.raises(EnvironmentUnavailable) as caught:
        check_environment(None, field="items[3].environment")
    assert (caught.value.environment, caught.value.field) == ("None", "items[3].environment")
    assert caught.value.__cause__ is None


def test_a_reference_naming_no_known_transport_is_unavailable_with_the_parsers_reason() -> None:
    with pytest.raises(EnvironmentUnavailable) as caught:
        check_environment("docker://alpine", field="environment")
    assert caught.value.environment == "docker://alpine"
    assert caught.value.reason.startswith("'docker://alpine' names no known transport (one of ")
    assert caught.value.field == "environment"


def _cache(*, refused: int, evicted: int, resolved: int) -> ImageCacheStatistics:
    return ImageCacheStatistics(
        images=1, bytes=10, max_bytes=100, hits=0, misses=0, refused=refused, evicted=evicted,
        unpack_seconds=0.0, recently_resolved=resolved,
    )  # fmt: skip


def test_a_server_without_an_image_cache_adds_nothing_to_the_cache_figures() -> None:
    """Its forks count; no cache means no hits, misses, refusals or seconds, not one of each."""
    book = ServerFigureBook()
    book.observe("a", "a", ServerFigures(forks=2))
    book.observe("a", "a", ServerFigures(forks=3))
    book.leave("a")
    book.observe("b", "b", ServerFigures())
    assert book.totals() == ServerTotals(server_forks=3)


def test_every_cache_counter_is_summed_over_the_servers() -> None:
    """Refusals, evictions and recent resolutions add up like hits and misses, a server that
    left included."""
    book = ServerFigureBook()
    book.observe("a", "host", ServerFigures(cache=_cache(refused=1, evicted=2, resolved=3)))
    book.observe("b", "host", ServerFigures(cache=_cache(refused=4, evicted=5, resolved=6)))
    book.observe("c", "other", ServerFigures(cache=_cache(refused=10, evicted=20, resolved=30)))
    book.leave("c")
    totals = book.totals()
    assert (totals.cache_refused, totals.cache_evicted, totals.cache_recently_resolved) == (
        15,
        27,
        39,
    )


def test_the_snapshots_the_servers_in_the_pool_hold_are_summed_with_their_bytes() -> None:
    book = ServerFigureBook()
    book.observe("a", "a", ServerFigures(snapshots=1, snapshot_bytes=100))
    book.observe("b", "b", ServerFigures(snapshots=2, snapshot_bytes=250))
    book.observe("c", "c", ServerFigures(snapshots=4, snapshot_bytes=1000))
    book.leave("c")
    totals = book.totals()
    assert (totals.held_snapshots, totals.held_snapshot_bytes) == (3, 350)
