from versions import newest_allowed

RELEASES = ["1.2.0", "1.9.1", "1.10.0", "1.11.0rc1", "2.0.0"]


def test_the_newest_allowed_release_is_picked() -> None:
    assert newest_allowed(["1.2.0", "1.3.0"], ">=1") == "1.3.0"


def test_versions_compare_as_versions_not_as_text() -> None:
    assert newest_allowed(RELEASES, ">=1.2,<2") == "1.10.0"
    assert newest_allowed(RELEASES, "~=1.9") == "1.10.0"


def test_nothing_allowed_is_none() -> None:
    assert newest_allowed(RELEASES, ">=3") is None
