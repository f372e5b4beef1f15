"""The decisions of the parsers' registry (``domain/tool_parsers/__init__``): which names may be
registered, when a name may be registered again, the order names are listed in, and what an
unknown name's refusal says.

Each test registers into a copy of the registry (``monkeypatch``), so the names it adds are gone
after it, and the registry's own calls at import are not what is checked: mutation testing
switches a mutant on only after the import. Other test modules register names at import, so
the tests compare with the names registered when they start, not with the built-ins alone."""

from __future__ import annotations

import pytest

from trajcore.domain import tool_parsers
from trajcore.domain.errors import ConfigError
from trajcore.domain.tool_parsers import PARSER_NAMES, get_parser, parser_names, register_parser
from trajcore.domain.tool_parsers.hermes import HermesParser
from trajcore.domain.tool_parsers.llama3_json import Llama3JsonParser


@pytest.fixture(autouse=True)
def own_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tool_parsers, "_FACTORIES", dict(tool_parsers._FACTORIES))


@pytest.mark.parametrize("name", ["", " ", "two words", "tab\there", " lead", "trail\n", "\u00a0"])
def test_a_parser_name_must_be_one_plain_word(name: str) -> None:
    """Pins the name rule: not empty and no whitespace anywhere (the config names it as one
    word); a refused name is not registered."""
    before = parser_names()
    with pytest.raises(ConfigError) as caught:
        register_parser(name, HermesParser)
    assert caught.value.field == "tool_call_parser"
    assert caught.value.reason == f"cannot register parser {name!r}: not a plain name"
    assert parser_names() == before


@pytest.mark.parametrize("name", [None, 3, b"bytes", ("hermes",)])
def test_a_parser_name_that_is_not_a_string_is_refused_naming_it(name: object) -> None:
    """Pins that callers outside trajcore passing a name of another type get the same refusal,
    not a TypeError from the checks that follow."""
    with pytest.raises(ConfigError) as caught:
        register_parser(name, HermesParser)  # type: ignore[arg-type]
    assert caught.value.field == "tool_call_parser"
    assert caught.value.reason == f"cannot register parser {name!r}: not a plain name"


def test_a_new_name_is_listed_after_the_builtins_and_gives_its_parser() -> None:
    """Pins the listing order (the built-ins, then the others as registered) and that
    ``get_parser`` calls the factory afresh each time."""
    made: list[Llama3JsonParser] = []

    def factory() -> Llama3JsonParser:
        made.append(Llama3JsonParser())
        return made[-1]

    before = parser_names()
    assert before[: len(PARSER_NAMES)] == PARSER_NAMES
    register_parser("z_first", factory)
    register_parser("a_second", HermesParser)
    assert parser_names() == (*before, "z_first", "a_second")
    first, second = get_parser("z_first"), get_parser("z_first")
    assert made == [first, second]
    assert first is made[0]
    assert second is made[1]
    assert isinstance(get_parser("a_second"), HermesParser)


def test_a_name_is_registered_once_unless_replaced() -> None:
    """Pins that registering a taken name is refused, naming it, and leaves its factory in
    place; ``replace=True`` puts the new factory there, for a new name as for a taken one."""
    before = parser_names()
    with pytest.raises(ConfigError) as caught:
        register_parser("llama3_json", HermesParser)
    assert caught.value.field == "tool_call_parser"
    assert caught.value.reason == (
        "parser 'llama3_json' is already registered (pass replace=True to override it)"
    )
    assert isinstance(get_parser("llama3_json"), Llama3JsonParser)
    register_parser("llama3_json", HermesParser, replace=True)
    assert isinstance(get_parser("llama3_json"), HermesParser)
    assert parser_names() == before  # replaced where it was, not listed again
    register_parser("fresh", HermesParser, replace=True)
    assert parser_names()[-1] == "fresh"


def test_an_unknown_name_is_refused_listing_every_registered_name_in_order() -> None:
    """Pins the refusal of an unknown name: the field, the name, and the known names (the
    registered ones too) joined by commas, in the listing order."""
    before = parser_names()
    register_parser("mine", HermesParser)
    with pytest.raises(ConfigError) as caught:
        get_parser("hermes2")
    assert caught.value.field == "tool_call_parser"
    assert caught.value.reason == (
        "unknown parser 'hermes2'; known: " + ", ".join((*before, "mine"))
    )
