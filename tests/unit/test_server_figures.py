"""``ServerFigureBook``: the slot servers' environment figures summed the way a pool reports
them (counts over every server ever read, a cache's contents once per cache, held snapshots
of the servers in the pool)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.domain.environment_leases import ServerFigureBook, ServerFigures, ServerTotals
from trajcore.domain.task_environments import ImageCacheStatistics, LeaseLayerStatistics


def cache(
    *, images: int = 1, hits: int = 0, misses: int = 0, seconds: float = 0.0
) -> ImageCacheStatistics:
    return ImageCacheStatistics(
        images=images, bytes=100 * images, max_bytes=1000, hits=hits, misses=misses,
        refused=0, evicted=0, unpack_seconds=seconds,
    )  # fmt: skip


def test_an_empty_book_sums_to_zero() -> None:
    assert ServerFigureBook().totals() == ServerTotals()


def test_servers_sharing_a_cache_count_its_contents_once_and_their_counts_each() -> None:
    book = ServerFigureBook()
    book.observe("a", "host", ServerFigures(cache=cache(hits=2, misses=1, seconds=1.5), forks=1))
    book.observe("b", "host", ServerFigures(cache=cache(images=2, hits=3), snapshots=1))
    book.observe("c", "other", ServerFigures(cache=cache(misses=1), snapshot_bytes=7))
    totals = book.totals()
    assert (totals.cache_servers, totals.caches) == (3, 2)
    assert (totals.cache_images, totals.cache_bytes, totals.cache_max_bytes) == (3, 300, 2000)
    assert (totals.cache_hits, totals.cache_misses, totals.cache_unpack_s) == (5, 2, 1.5)
    assert (totals.held_snapshots, totals.held_snapshot_bytes, totals.server_forks) == (1, 7, 1)


def test_a_server_that_leaves_keeps_its_counts_and_drops_what_it_held() -> None:
    book = ServerFigureBook()
    book.observe("a", "a", ServerFigures(cache=cache(hits=4), snapshots=2, forks=3))
    book.leave("a")
    book.leave("never-seen")
    totals = book.totals()
    assert (totals.cache_hits, totals.server_forks) == (4, 3)
    assert (totals.cache_servers, totals.caches, totals.cache_images) == (0, 0, 0)
    assert totals.held_snapshots == 0


def test_counts_that_go_back_are_a_new_process_and_add_up() -> None:
    book = ServerFigureBook()
    book.observe("a", "a", ServerFigures(cache=cache(hits=4)))
    book.observe("a", "a", ServerFigures(cache=cache(hits=6)))  # later reading: replaces
    assert book.totals().cache_hits == 6
    book.observe("a", "a", ServerFigures(cache=cache(hits=1)))  # restarted under its name
    assert book.totals().cache_hits == 7


def test_the_latest_reading_of_a_cache_counts() -> None:
    book = ServerFigureBook()
    book.observe("a", "host", ServerFigures(cache=cache(images=1)))
    book.observe("b", "host", ServerFigures(cache=cache(images=2)))
    book.observe("a", "host", ServerFigures(cache=cache(images=3)))
    assert book.totals().cache_images == 3
    book.observe("b", "host", ServerFigures(cache=None))  # a server without a cache
    assert (book.totals().cache_servers, book.totals().cache_images) == (1, 3)


@st.composite
def readings(draw: st.DrawFn) -> list[tuple[str, str, int]]:
    """Steps: (``observe`` or ``leave``, server, how much its hits grew); a server's hits only
    grow while it runs, and start again from 0 after it left."""
    step = st.tuples(
        st.sampled_from(["observe", "leave"]), st.sampled_from("abc"), st.integers(0, 5)
    )
    return draw(st.lists(step, max_size=30))


@given(readings())
def test_counts_never_go_down_and_sum_every_servers_last_reading(
    steps: list[tuple[str, str, int]],
) -> None:
    book = ServerFigureBook()
    hits: dict[str, int] = {}
    expected = 0  # what servers that left had counted
    last = 0
    for action, server, grew in steps:
        if action == "leave":
            expected += hits.pop(server, 0)
            book.leave(server)
        else:
            hits[server] = hits.get(server, 0) + grew
            book.observe(server, "host", ServerFigures(cache=cache(hits=hits[server])))
        total = book.totals().cache_hits
        assert total >= last
        assert total == expected + sum(hits.values())
        assert book.totals().caches == (1 if hits else 0)
        last = total


def layers(*sizes: int, cut_short: int = 0) -> LeaseLayerStatistics:
    figures = LeaseLayerStatistics()
    for index, size in enumerate(sizes):
        figures = figures.add(
            size=size, entries=size // 10, cut_short=index < cut_short, seconds=0.25
        )
    return figures


def test_a_servers_layers_count_each_one_the_largest_and_the_last() -> None:
    figures = layers(300, 1000, 20, cut_short=1)
    assert (figures.measured, figures.bytes, figures.entries) == (3, 1320, 132)
    assert (figures.largest_bytes, figures.last_bytes, figures.last_entries) == (1000, 20, 2)
    assert (figures.cut_short, figures.measure_seconds) == (1, 0.75)
    with pytest.raises(ValueError, match="size: a layer's figure cannot be negative"):
        figures.add(size=-1, entries=0, cut_short=False, seconds=0.0)


def test_the_servers_layers_are_summed_and_the_largest_is_the_largest_of_all() -> None:
    book = ServerFigureBook()
    book.observe("a", "host", ServerFigures(cache=cache(), layers=layers(100, 5000)))
    book.observe("b", "host", ServerFigures(cache=cache(), layers=layers(700, cut_short=1)))
    totals = book.totals()
    assert (totals.layers_measured, totals.layer_bytes, totals.layer_entries) == (3, 5800, 580)
    assert (totals.layer_largest_bytes, totals.layers_cut_short) == (5000, 1)
    assert totals.layer_measure_s == 0.75
    book.leave("a")  # what it measured stays counted, its largest layer too
    book.observe("b", "host", ServerFigures(cache=cache(), layers=layers(700, 10, cut_short=1)))
    after = book.totals()
    assert (after.layers_measured, after.layer_bytes, after.layer_largest_bytes) == (4, 5810, 5000)
    # a server whose layer count went back is a new process: its old count is kept
    book.observe("b", "host", ServerFigures(cache=cache(), layers=layers(3)))
    again = book.totals()
    assert (again.layers_measured, again.layer_bytes) == (5, 5813)
