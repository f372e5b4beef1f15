"""Toolsets: resolution (enabled, then disabled on top), distributions, selection per group."""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trajcore.domain.errors import ConfigError
from trajcore.domain.tools import ToolSpec
from trajcore.domain.toolsets import (
    DistributionRegistry,
    Toolset,
    ToolsetCatalog,
    ToolsetDistribution,
    ToolsetSelection,
    select_specs,
)

TOOLS = ["bash", "read_file", "write_file", "tmux", "web_search", "image", "python"]


def sample_catalog() -> ToolsetCatalog:
    return ToolsetCatalog(
        toolsets=[
            Toolset(name="file", tools=["read_file", "write_file"]),
            Toolset(name="terminal", tools=["bash", "tmux"], includes=["file"]),
            Toolset(name="web", tools=["web_search"]),
            Toolset(name="everything", includes=["web", "terminal"], tools=["image"]),
        ]
    )


@st.composite
def catalogs(draw: st.DrawFn) -> ToolsetCatalog:
    """Random acyclic catalogs: toolset i may include only toolsets declared before it."""
    count = draw(st.integers(min_value=1, max_value=6))
    toolsets = []
    for i in range(count):
        tools = draw(st.lists(st.sampled_from(TOOLS), max_size=4))
        includes = (
            draw(st.lists(st.sampled_from([f"t{j}" for j in range(i)]), max_size=3)) if i else []
        )
        toolsets.append(Toolset(name=f"t{i}", tools=tools, includes=includes))
    order = draw(st.permutations(toolsets))
    return ToolsetCatalog(toolsets=order)


def expansion(catalog: ToolsetCatalog, name: str) -> set[str]:
    """A naive second reading of what a toolset offers: the model to check against."""
    toolset = next(t for t in catalog.toolsets if t.name == name)
    out = set(toolset.tools)
    for included in toolset.includes:
        out |= expansion(catalog, included)
    return out


# ------------------------------------------------------------------------------------ catalog


def test_tools_of_expands_includes_in_order() -> None:
    catalog = sample_catalog()
    assert catalog.tools_of("terminal") == ("bash", "tmux", "read_file", "write_file")
    assert catalog.tools_of("everything") == (
        "image",
        "web_search",
        "bash",
        "tmux",
        "read_file",
        "write_file",
    )


def test_resolve_all_by_default_in_catalog_order() -> None:
    catalog = sample_catalog()
    assert catalog.resolve() == ("read_file", "write_file", "bash", "tmux", "web_search", "image")
    assert catalog.resolve() == catalog.all_tools()


def test_disabled_wins_over_enabled() -> None:
    catalog = sample_catalog()
    assert catalog.resolve(enabled=["terminal"], disabled=["file"]) == ("bash", "tmux")
    assert catalog.resolve(enabled=["everything"], disabled=["terminal"]) == ("web_search", "image")
    assert catalog.resolve(enabled=["file"], disabled=["everything"]) == ()


def test_cycle_is_a_config_error_naming_the_toolset() -> None:
    with pytest.raises(ConfigError) as caught:
        ToolsetCatalog(
            toolsets=[
                Toolset(name="a", includes=["b"]),
                Toolset(name="b", includes=["c"]),
                Toolset(name="c", includes=["a"]),
            ]
        )
    assert caught.value.field == "toolsets.a.includes"
    assert "a -> b -> c -> a" in caught.value.reason


def test_self_include_is_a_cycle() -> None:
    with pytest.raises(ConfigError, match=r"includes itself: x -> x @ toolsets\.x\.includes"):
        ToolsetCatalog(toolsets=[Toolset(name="x", includes=["x"], tools=["bash"])])


def test_unknown_include_names_the_toolset_and_position() -> None:
    with pytest.raises(ConfigError) as caught:
        ToolsetCatalog(
            toolsets=[Toolset(name="web", includes=["file", "nope"]), Toolset(name="file")]
        )
    assert caught.value.field == "toolsets.web.includes[1]"
    assert "'nope'" in caught.value.reason


def test_duplicate_toolset_name_rejected() -> None:
    with pytest.raises(ConfigError, match=r"duplicate toolset 'a' @ toolsets\[1\]\.name"):
        ToolsetCatalog(toolsets=[Toolset(name="a"), Toolset(name="a")])


def test_unknown_enabled_or_disabled_names_the_field() -> None:
    catalog = sample_catalog()
    with pytest.raises(ConfigError) as caught:
        catalog.resolve(enabled=["web", "webb"])
    assert caught.value.field == "enabled_toolsets[1]"
    with pytest.raises(ConfigError) as caught:
        catalog.resolve(disabled=["gone"])
    assert caught.value.field == "disabled_toolsets[0]"


def test_bad_toolset_members_rejected() -> None:
    with pytest.raises(ConfigError, match=r"@ toolsets\.a\.tools\[1\]"):
        Toolset(name="a", tools=["bash", ""])
    with pytest.raises(ConfigError, match=r"@ name"):
        Toolset(name="")
    # A bare string is one name, not a sequence of characters.
    assert Toolset(name="a", tools="bash").tools == ("bash",)


@given(catalogs(), st.data())
def test_resolution_matches_the_set_model(catalog: ToolsetCatalog, data: st.DataObject) -> None:
    names = list(catalog.names())
    enabled = data.draw(st.none() | st.lists(st.sampled_from(names)))
    disabled = data.draw(st.lists(st.sampled_from(names)))
    result = catalog.resolve(enabled=enabled, disabled=disabled)
    on = set().union(*(expansion(catalog, n) for n in (names if enabled is None else enabled)))
    off = set().union(*(expansion(catalog, n) for n in disabled))
    assert set(result) == on - off
    assert len(result) == len(set(result))
    # catalog order: the result is a subsequence of all_tools()
    positions = [catalog.all_tools().index(t) for t in result]
    assert positions == sorted(positions)


@given(catalogs(), st.data())
def test_resolution_is_idempotent_and_order_independent(
    catalog: ToolsetCatalog, data: st.DataObject
) -> None:
    names = list(catalog.names())
    enabled = data.draw(st.lists(st.sampled_from(names)))
    disabled = data.draw(st.lists(st.sampled_from(names)))
    result = catalog.resolve(enabled=enabled, disabled=disabled)
    assert catalog.resolve(enabled=enabled, disabled=disabled) == result
    assert catalog.resolve(enabled=enabled, disabled=disabled + disabled) == result
    assert catalog.resolve(enabled=enabled, disabled=data.draw(st.permutations(disabled))) == result
    assert catalog.resolve(enabled=data.draw(st.permutations(enabled)), disabled=disabled) == result
    # resolving again over what is left removes nothing more
    assert set(catalog.resolve(enabled=enabled, disabled=[])) >= set(result)


@given(catalogs(), st.data())
def test_disabled_tools_never_offered(catalog: ToolsetCatalog, data: st.DataObject) -> None:
    names = list(catalog.names())
    disabled = data.draw(st.lists(st.sampled_from(names), min_size=1))
    result = set(catalog.resolve(enabled=None, disabled=disabled))
    for name in disabled:
        assert result.isdisjoint(catalog.tools_of(name))


# ------------------------------------------------------------------------------- distributions


def test_distribution_validation_names_the_field() -> None:
    with pytest.raises(
        ConfigError, match=r"must be in \[0, 1\], got 1\.5 @ toolset_distribution\.web"
    ):
        ToolsetDistribution(probabilities={"web": 1.5})
    with pytest.raises(ConfigError, match=r"@ mix\.web"):
        ToolsetDistribution(name="mix", probabilities={"web": math.nan})
    with pytest.raises(ConfigError, match=r"expected a number, got bool @ mix\.web"):
        ToolsetDistribution(name="mix", probabilities={"web": True})
    with pytest.raises(ConfigError, match=r"needs at least one toolset @ mix"):
        ToolsetDistribution(name="mix", probabilities={})
    with pytest.raises(ConfigError, match=r"above 0 @ mix"):
        ToolsetDistribution(name="mix", probabilities={"web": 0.0, "file": 0})
    with pytest.raises(ConfigError, match=r"listed twice @ mix\.web"):
        ToolsetDistribution(name="mix", probabilities=[("web", 0.5), ("web", 0.2)])
    with pytest.raises(ConfigError, match=r"@ mix\.web"):
        ToolsetDistribution(name="mix", probabilities={"web": -0.1})


def test_most_probable_first_among_equals() -> None:
    dist = ToolsetDistribution(probabilities={"a": 0.2, "b": 0.7, "c": 0.7})
    assert dist.most_probable() == "b"


def test_sampling_fallback_when_nothing_drawn() -> None:
    dist = ToolsetDistribution(probabilities={"a": 0.0, "b": 1e-300, "c": 0.0})
    assert dist.sample(random.Random(1)) == ("b",)


def test_certain_toolsets_always_drawn() -> None:
    dist = ToolsetDistribution(probabilities={"a": 1.0, "b": 0.0, "c": 1})
    rng = random.Random(0)
    assert all(dist.sample(rng) == ("a", "c") for _ in range(50))


probabilities = st.dictionaries(
    st.sampled_from(["file", "terminal", "web", "everything"]),
    st.floats(min_value=0.0, max_value=1.0),
    min_size=1,
).filter(lambda d: any(p > 0 for p in d.values()))


@given(probabilities, st.integers(min_value=0, max_value=2**32))
def test_sampling_is_deterministic_never_empty_and_in_order(
    probs: dict[str, float], seed: int
) -> None:
    dist = ToolsetDistribution(probabilities=probs)
    first = [dist.sample(random.Random(seed)) for _ in range(3)]
    assert first[0] == first[1] == first[2]
    rng = random.Random(seed)
    for _ in range(20):
        chosen = dist.sample(rng)
        assert chosen
        assert len(set(chosen)) == len(chosen)
        declared = dist.toolsets()
        assert [declared.index(c) for c in chosen] == sorted(declared.index(c) for c in chosen)
        assert all(probs[c] > 0 for c in chosen)


@given(probabilities, st.integers(min_value=0, max_value=2**32))
def test_sampling_draws_one_number_per_toolset(probs: dict[str, float], seed: int) -> None:
    dist = ToolsetDistribution(probabilities=probs)
    rng, twin = random.Random(seed), random.Random(seed)
    dist.sample(rng)
    for _ in probs:
        twin.random()
    assert rng.random() == twin.random()


def test_frequencies_follow_probabilities() -> None:
    probs = {"file": 0.9, "terminal": 0.5, "web": 0.2, "everything": 0.05}
    dist = ToolsetDistribution(probabilities=probs)
    rng = random.Random(20260101)
    trials = 20_000
    counts = dict.fromkeys(probs, 0)
    for _ in range(trials):
        for name in dist.sample(rng):
            counts[name] += 1
    expected = dict(probs)
    # the fallback adds P(nothing drawn) to the most probable toolset
    expected["file"] += math.prod(1 - p for p in probs.values())
    for name, p in expected.items():
        sigma = math.sqrt(p * (1 - p) / trials)
        assert abs(counts[name] / trials - p) < max(5 * sigma, 0.01), name


def test_distribution_check_against_catalog() -> None:
    catalog = sample_catalog()
    ToolsetDistribution(probabilities={"web": 0.5}).check_against(catalog)
    with pytest.raises(ConfigError, match=r"unknown toolset 'wbe'.* @ toolset_distribution\.wbe"):
        ToolsetDistribution(probabilities={"web": 0.5, "wbe": 0.5}).check_against(catalog)


def test_registry_get_and_errors() -> None:
    a = ToolsetDistribution(name="a", probabilities={"web": 0.5})
    b = ToolsetDistribution(name="b", probabilities={"file": 1.0})
    registry = DistributionRegistry(distributions=[a, b])
    assert registry.names() == ("a", "b")
    assert registry.get("b") is b
    with pytest.raises(ConfigError, match=r"unknown distribution 'c'.* @ toolset_distribution"):
        registry.get("c")
    with pytest.raises(
        ConfigError, match=r"duplicate distribution 'a' @ toolset_distributions\[1\]"
    ):
        DistributionRegistry(distributions=[a, a])
    registry.check_against(sample_catalog())
    bad = DistributionRegistry(
        distributions=[ToolsetDistribution(name="z", probabilities={"q": 1.0})]
    )
    with pytest.raises(ConfigError, match=r"@ z\.q"):
        bad.check_against(sample_catalog())


# ---------------------------------------------------------------------------------- selection


def test_selection_explicit_list() -> None:
    catalog = sample_catalog()
    selection = ToolsetSelection(enabled=["terminal"], disabled=["file"])
    drawn = selection.draw(catalog, random.Random(0))
    assert drawn.toolsets == ("terminal",)
    assert drawn.tools == ("bash", "tmux")


def test_selection_all_by_default() -> None:
    catalog = sample_catalog()
    drawn = ToolsetSelection().draw(catalog, random.Random(0))
    assert drawn.toolsets == catalog.names()
    assert drawn.tools == catalog.all_tools()


def test_selection_with_distribution_is_seeded_and_disabled_applies() -> None:
    catalog = sample_catalog()
    selection = ToolsetSelection(
        distribution=ToolsetDistribution(probabilities={"terminal": 0.5, "web": 0.5}),
        disabled=["file"],
    )
    draws = [selection.draw(catalog, random.Random(seed)) for seed in range(40)]
    assert draws == [selection.draw(catalog, random.Random(seed)) for seed in range(40)]
    assert {d.toolsets for d in draws} == {("terminal",), ("web",), ("terminal", "web")}
    for d in draws:
        assert d.tools
        assert "read_file" not in d.tools


def test_selection_refuses_list_and_distribution_together() -> None:
    with pytest.raises(ConfigError, match=r"not both @ toolset_distribution"):
        ToolsetSelection(
            enabled=["web"], distribution=ToolsetDistribution(probabilities={"web": 1.0})
        )


def test_selection_check_against_names_the_field() -> None:
    catalog = sample_catalog()
    ToolsetSelection(enabled=["web"], disabled=["file"]).check_against(catalog)
    with pytest.raises(ConfigError, match=r"@ enabled_toolsets\[1\]"):
        ToolsetSelection(enabled=["web", "x"]).check_against(catalog)
    with pytest.raises(ConfigError, match=r"@ disabled_toolsets\[0\]"):
        ToolsetSelection(disabled=["x"]).check_against(catalog)
    with pytest.raises(ConfigError, match=r"@ toolset_distribution\.x"):
        ToolsetSelection(distribution=ToolsetDistribution(probabilities={"x": 1.0})).check_against(
            catalog
        )


def test_a_toolset_turned_on_whose_every_tool_is_disabled_is_refused() -> None:
    catalog = sample_catalog()
    # terminal keeps bash and tmux when file is off: it still gives tools
    ToolsetSelection(enabled=["terminal"], disabled=["file"]).check_against(catalog)
    with pytest.raises(ConfigError) as caught:
        ToolsetSelection(enabled=["web", "file"], disabled=["terminal"]).check_against(catalog)
    assert caught.value.field == "enabled_toolsets[1]"
    assert "every tool of toolset 'file' is switched off by disabled_toolsets" in str(caught.value)
    drawn = ToolsetDistribution(probabilities={"web": 0.5, "file": 1.0})
    with pytest.raises(ConfigError, match=r"toolset 'file' .* @ toolset_distribution\.file"):
        ToolsetSelection(distribution=drawn, disabled=["file"]).check_against(catalog)
    never = ToolsetDistribution(probabilities={"web": 1.0, "file": 0.0})  # never drawn: fine
    ToolsetSelection(distribution=never, disabled=["file"]).check_against(catalog)
    empty = ToolsetCatalog(toolsets=[Toolset(name="external"), Toolset(name="file", tools=["a"])])
    ToolsetSelection(enabled=["external"], disabled=["file"]).check_against(empty)  # no tools


def test_select_specs_in_order_and_missing_named() -> None:
    specs = [ToolSpec(name="bash"), ToolSpec(name="read_file"), ToolSpec(name="tmux")]
    assert [s.name for s in select_specs(("tmux", "bash"), specs)] == ["tmux", "bash"]
    with pytest.raises(ConfigError, match=r"no tool spec named 'web_search' @ tools\[1\]"):
        select_specs(("bash", "web_search"), specs)
