"""The pools: the ``SandboxPool`` port over slot servers, as it runs beside the env.

A pool starts or finds slot servers (``trajcore.adapters.slot_server``, each in its own process,
container, allocation or job), leases their slots to trajectories, batches the calls per server
and replaces a server that dies. Every real pool is one machine, ``pool_core.SlotServerPool``,
around a *source* that runs the servers:

- ``local_pool`` (child processes of this one) and ``container_pool`` (containers of podman or
  docker), both supervised by ``supervision``; ``server_processes`` is what they share.
- The scheduled ones, reconciled against a scheduler by ``reconciled``: ``nomad_pool`` (over
  ``nomad_client``), ``slurm_pool``, ``ssh_pool`` (with ``ssh_remote``, what runs on each host),
  and the cloud pools ``cloud_pool`` with ``modal_pool``/``modal_sdk`` and
  ``daytona_pool``/``daytona_sdk``.
- The parts the core drives: ``client`` (``SlotServerClient``, one server over HTTP),
  ``leasing`` (the domain's slot book plus waiting), ``batches`` (one batch to one server, with
  its failure rules) and ``environment_leasing`` (leases over task environments).
"""
