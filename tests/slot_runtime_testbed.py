"""What the tests that run a ``SlotRuntime`` in this process share: a bash call to slot 0, and a
server root every uid may search."""

from __future__ import annotations

import itertools
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from trajcore.domain.json_values import JSON
from trajcore.domain.slot_protocol import ExecuteCall

_ids = itertools.count(1)


def call(epoch: int, command: str) -> ExecuteCall:
    """``command`` run by bash in slot 0 under lease ``epoch``, a fresh call id, 10 s at most."""
    arguments: dict[str, JSON] = {"command": command}
    return ExecuteCall(
        slot=0, epoch=epoch, call_id=f"c{next(_ids)}", tool="bash", arguments=arguments,
        timeout_s=10.0,
    )  # fmt: skip


@contextmanager
def searchable_root(prefix: str) -> Iterator[Path]:
    """A server root every uid may search (a root server runs its slots as other uids), removed
    afterwards."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    folder.chmod(0o711)
    try:
        yield folder / "root"
    finally:
        shutil.rmtree(folder, ignore_errors=True)
