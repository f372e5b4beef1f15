"""Which host uids ``trajcore slot-server`` gives its slots: a base, and a block per server so
that servers sharing a host's uids (Nomad allocations on one node) never share a slot uid."""

from __future__ import annotations

from pathlib import Path

import pytest

from trajcore.domain.errors import ConfigError
from trajcore.domain.isolation import DEFAULT_SLOT_UID_BASE, MAX_SLOT_UID
from trajcore.entrypoints.slot_server import _config, parse_args


def _uid_base(root: Path, *extra: str) -> int:
    argv = ["--slots", "4", "--root", str(root), "--unix", str(root / "s.sock"), *extra]
    config, _ = _config(parse_args(argv))
    return config.slot_uid_base


def test_each_block_of_a_base_is_a_disjoint_range_of_slot_uids(tmp_path: Path) -> None:
    assert _uid_base(tmp_path) == DEFAULT_SLOT_UID_BASE
    bases = [_uid_base(tmp_path, "--slot-uid-block", str(k)) for k in range(3)]
    assert bases == [DEFAULT_SLOT_UID_BASE + 4 * k for k in range(3)]
    ranges = [set(range(base, base + 4)) for base in bases]
    assert not ranges[0] & ranges[1]
    assert not ranges[1] & ranges[2]
    assert _uid_base(tmp_path, "--slot-uid-base", "3000000", "--slot-uid-block", "2") == 3000008


@pytest.mark.parametrize("block", ["-1", str(MAX_SLOT_UID)])
def test_a_block_out_of_range_is_refused_naming_it(tmp_path: Path, block: str) -> None:
    with pytest.raises(ConfigError) as caught:
        _uid_base(tmp_path, "--slot-uid-block", block)
    assert caught.value.field == "--slot-uid-block"
