"""A strict fake of the Nomad agent's HTTP API whose allocations run for real (``FakeNomadAPI``).

Nomad's OpenAPI description is read from the file ``$TRAJCORE_NOMAD_OPENAPI`` names
(``NomadOpenAPI.from_env()``), and from nowhere else. Modules by concern: ``agent`` (routes and
the scheduler), ``openapi`` (schema checks), ``jobs`` (Nomad's job rules, records),
``processes`` (running a task), ``render`` (the JSON answers).
"""
