"""Slot servers: bubblewrap sandboxes per slot, the exec agent inside them, and the HTTP client.

Modules: ``codec`` (the protocol on the wire), ``exec_agent`` and ``exec_keeper`` (the
stdlib-only program that runs as a sandbox's first process and serves its leases),
``workspace`` (file tools confined to a slot's workspace), ``limits`` (cgroups or rlimits per
slot), ``runtime`` (N slots, their sandboxes and tools; with ``runtime_config``, ``channel``,
``sandboxes``, ``capabilities``, ``tool_calls`` and ``resets``), ``server`` (the HTTP face of a
runtime) and ``client`` (``SlotServerClient``).
"""
