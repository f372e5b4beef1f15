"""Pick the release to install: the newest one a requirement allows."""

from versions.pick import newest_allowed

__all__ = ["newest_allowed"]
