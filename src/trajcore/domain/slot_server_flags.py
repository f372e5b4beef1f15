"""Former home of the slot server's policy flags, now ``trajcore.domain.sandbox_policy``.

``SlotServerFlags`` is ``SlotPolicy`` (memory is ``memory_bytes``); the slot uid constants and
``check_slot_uid_range`` live with it.
"""

from __future__ import annotations

from trajcore.domain.sandbox_policy import (
    DEFAULT_SLOT_UID_BASE,
    MAX_SLOT_UID,
    MIN_SLOT_UID_BASE,
    SLOT_HELPERS,
    SlotPolicy,
    check_slot_uid_range,
)

__all__ = [
    "DEFAULT_SLOT_UID_BASE",
    "MAX_SLOT_UID",
    "MIN_SLOT_UID_BASE",
    "SLOT_HELPERS",
    "SlotServerFlags",
    "check_slot_uid_range",
]

SlotServerFlags = SlotPolicy
