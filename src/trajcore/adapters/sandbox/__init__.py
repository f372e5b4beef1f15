"""Slot servers: bubblewrap sandboxes per slot, the slot helper inside them, and the HTTP client.

Modules: ``codec`` (the protocol on the wire), ``slot_helper.c`` and ``native_helper`` (the
compiled program that runs as a sandbox's first process and serves its leases, and how a server
finds or builds it; docs/sandbox.md documents its protocol),
``workspace`` (file tools confined to a slot's workspace), ``limits`` (cgroups or rlimits per
slot), ``runtime`` (N slots, their sandboxes and tools; with ``runtime_config``, ``channel``,
``sandboxes``, ``capabilities``, ``tool_calls`` and ``resets``), ``server`` (the HTTP face of a
runtime) and ``client`` (``SlotServerClient``).
"""
