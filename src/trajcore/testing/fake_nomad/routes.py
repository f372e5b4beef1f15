"""The paths the fake Nomad serves, matched to the operations of Nomad's OpenAPI description.

Anything else is refused as an agent refuses it: 404 for an unknown path, 405 for a known path
with another method.
"""

from __future__ import annotations

import re
from typing import Final

from trajcore.testing.fake_nomad.jobs import Refused

__all__ = ["route"]

_ROUTES: Final = (  # (method, path pattern, path in the OpenAPI description)
    ("GET", re.compile(r"^/v1/status/leader$"), "/status/leader"),
    ("POST", re.compile(r"^/v1/jobs$"), "/jobs"),
    ("GET", re.compile(r"^/v1/job/(?P<job>[^/]+)$"), "/job/{jobName}"),
    ("POST", re.compile(r"^/v1/job/(?P<job>[^/]+)$"), "/job/{jobName}"),
    ("DELETE", re.compile(r"^/v1/job/(?P<job>[^/]+)$"), "/job/{jobName}"),
    ("GET", re.compile(r"^/v1/job/(?P<job>[^/]+)/allocations$"), "/job/{jobName}/allocations"),
    ("GET", re.compile(r"^/v1/job/(?P<job>[^/]+)/evaluations$"), "/job/{jobName}/evaluations"),
    ("POST", re.compile(r"^/v1/job/(?P<job>[^/]+)/scale$"), "/job/{jobName}/scale"),
    ("GET", re.compile(r"^/v1/allocation/(?P<alloc>[^/]+)$"), "/allocation/{allocID}"),
    ("POST", re.compile(r"^/v1/allocation/(?P<alloc>[^/]+)/stop$"), "/allocation/{allocID}/stop"),
)


def route(method: str, path: str) -> tuple[str, dict[str, str]]:
    """The description's path template for ``method path`` and the path's parameters.

    Raises ``Refused`` (404 unknown path, 405 another method).
    """
    known_path = False
    for route_method, pattern, template in _ROUTES:
        found = pattern.match(path)
        if found is not None:
            known_path = True
            if route_method == method:
                return template, found.groupdict()
    if known_path:
        raise Refused(405, "Invalid method")
    raise Refused(404, "Invalid URL")
