"""Which Nomad agent the Nomad pool talks to, and as whom: the env's settings, else Nomad's own
environment variables.

An operator's shell that the ``nomad`` command line works in has ``$NOMAD_ADDR`` (and often
``$NOMAD_TOKEN``, ``$NOMAD_NAMESPACE``, ``$NOMAD_REGION``); the Nomad pool reads them the same way
(``NOMAD_VARIABLES``). Rules it keeps:

- A setting given (not ``None``) wins over its variable; a variable that is unset or empty is
  not given. Neither: the pool's default address (``NomadPoolConfig``), no token, the agent's
  namespace and region.
- Where each value came from is kept (``NomadAgent.sources``) for the start-up log
  (``NomadAgent.line``), which never shows the token, only where it came from.
- A value read from a variable is checked as the setting's would be; its error names the
  setting and says the value came from the variable.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import attrs

__all__ = ["NOMAD_VARIABLES", "NomadAgent", "nomad_agent"]

NOMAD_VARIABLES: Mapping[str, str] = {
    "nomad_address": "NOMAD_ADDR",
    "nomad_token": "NOMAD_TOKEN",
    "nomad_namespace": "NOMAD_NAMESPACE",
    "nomad_region": "NOMAD_REGION",
}
"""Each env setting read from a Nomad environment variable when it is not given."""


@attrs.frozen(kw_only=True)
class NomadAgent:
    """The Nomad agent of the pool and how it is addressed, each value with its source.

    Attributes:
        values: By env setting (``nomad_address``, ...): the value in effect, ``None`` where
            neither the setting nor its variable gives one.
        sources: By env setting: ``"setting"``, ``"$NOMAD_..."`` (the variable read), or
            ``"default"``.
    """

    values: Mapping[str, str | None] = attrs.field(repr=False)  # holds the token
    sources: Mapping[str, str]

    def from_variable(self, setting: str) -> str | None:
        """The variable ``setting``'s value was read from, or ``None`` (given, or unset)."""
        source = self.sources.get(setting, "default")
        return source[1:] if source.startswith("$") else None

    def line(self, default_address: str) -> str:
        """One line for the start-up log: the address and where each value came from; the
        token only as set or not, never its text."""
        where = {"setting": "--env.{}", "default": "default"}

        def origin(setting: str) -> str:
            source = self.sources[setting]
            return where.get(source, source).format(setting)

        address = self.values["nomad_address"] or default_address
        parts = [f"Nomad agent {address} (from {origin('nomad_address')})"]
        unset = self.values["nomad_token"] is None
        parts.append("no ACL token" if unset else f"ACL token from {origin('nomad_token')}")
        for setting, noun in (("nomad_namespace", "namespace"), ("nomad_region", "region")):
            value = self.values[setting]
            parts.append(
                f"{noun}: the agent's"
                if value is None
                else f"{noun} {value} (from {origin(setting)})"
            )
        return "; ".join(parts)


def nomad_agent(
    given: Mapping[str, str | None], environ: Mapping[str, str] | None = None
) -> NomadAgent:
    """The agent of the settings ``given`` (by env setting, ``NOMAD_VARIABLES``' keys; a
    missing one is not given), each not given read from its variable in ``environ``
    (default: this process's environment)."""
    environ = os.environ if environ is None else environ
    values: dict[str, str | None] = {}
    sources: dict[str, str] = {}
    for setting, variable in NOMAD_VARIABLES.items():
        value = given.get(setting)
        found = environ.get(variable, "").strip()
        if value is not None:
            values[setting], sources[setting] = value, "setting"
        elif found:
            values[setting], sources[setting] = found, f"${variable}"
        else:
            values[setting], sources[setting] = None, "default"
    return NomadAgent(values=values, sources=sources)
