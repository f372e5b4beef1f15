"""The newest release of a package that a requirement (``>=1.2,<2``) allows."""

from __future__ import annotations

from collections.abc import Iterable

from packaging.specifiers import SpecifierSet
from packaging.version import Version


def newest_allowed(releases: Iterable[str], requirement: str) -> str | None:
    """The newest of ``releases`` that ``requirement`` allows (pre-releases only when the
    requirement names one), or ``None`` when it allows none.

    Raises:
        packaging.specifiers.InvalidSpecifier: ``requirement`` is not a version specifier.
        packaging.version.InvalidVersion: a release is not a version.
    """
    allowed = SpecifierSet(requirement)
    candidates = [release for release in releases if Version(release) in allowed]
    if not candidates:
        return None
    return max(candidates)
