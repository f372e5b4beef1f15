"""The slot server: the program that runs N isolated slots in one container (or process tree).

It is what ``trajcore slot-server`` starts (``trajcore.entrypoints.slot_server``), alone, inside
a container, an allocation or a batch job. Nothing here runs beside the env; the env reaches a
slot server over HTTP through ``trajcore.adapters.pools``.

Where each part lives:

- The face: ``server`` (the HTTP routes of one runtime) and ``codec`` (the protocol's JSON on the
  wire, which the pools' client shares).
- The slots: ``runtime`` (N slots, their leases, calls and resets; configured by
  ``runtime_config``), ``sandboxes`` (how a slot's sandbox and keeper are started),
  ``channel`` (the keeper's pipe), ``tool_calls`` (one call, run in a slot), ``workspace``
  (file tools confined to a slot's workspace), ``resets`` and ``slot_ids``.
- The lease steps: ``slot_helper.c``, the compiled keeper that is a sandbox's first process and
  performs every lease step (docs/sandbox.md holds its protocol), and ``native_helper``, which
  finds the shipped binary or builds it once.
- The host's means: ``capabilities`` (what the host can do, probed once), ``limits`` (cgroups or
  rlimits per slot), ``seccomp`` (the filter compiled from the domain's rules).
- Task environments: ``image_sources``, ``image_unpack`` and ``image_cache`` (images unpacked
  once per host into a read-only cache), ``snapshots``, ``forks`` and ``workspace_overlays``
  (prepared leases frozen and forked copy-on-write).
"""
