"""The core install's modules load only the core's dependencies.

``pip install trajcore`` brings attrs, cattrs, anyio, jsonschema and what they need; everything else
comes with an extra. The slot server, the sandbox adapters, the pools, the domain, the ports and the
rollout core must import in that install, so each is imported here in a fresh interpreter and every
third-party module it loaded is traced to its distribution, which must be one the core requires,
directly or through its own requirements (the Nomad pool imports python-nomad, of the ``nomad``
extra, only when it makes its client). The full
development lock is installed while this runs: a module that imported, say, transformers would load
it here and fail, where in the core install it would fail to import at all.
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import json
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest
from packaging.requirements import Requirement

SRC = Path(__file__).resolve().parents[2] / "src" / "trajcore"

# The trainer stack and the other extras' heavy packages, named so that a failure reads plainly.
# Distributions a core dependency imports when they happen to be installed, and only then: anyio
# looks for sniffio (another extra's dependency brings it into the full lock).
OPTIONAL_OF_CORE = {"sniffio"}
TRAINER_STACK = {"atroposlib", "transformers", "tokenizers", "torch", "httpx", "aiohttp", "openai"}


def _submodules(package: str) -> list[str]:
    folder = SRC.joinpath(*package.split(".")[1:])
    return [package, *(f"{package}.{info.name}" for info in pkgutil.iter_modules([str(folder)]))]


def _closure(extras: frozenset[str]) -> set[str]:
    """Normalized names of the distributions trajcore needs with ``extras``, transitively."""
    wanted: set[str] = set()
    pending: list[tuple[str, frozenset[str]]] = [("trajcore", extras)]
    while pending:
        name, active = pending.pop()
        for line in importlib.metadata.requires(name) or []:
            requirement = Requirement(line)
            marker = requirement.marker
            environments = [{"extra": extra} for extra in active] or [{"extra": ""}]
            if marker is not None and not any(marker.evaluate(env) for env in environments):
                continue
            key = _normalize(requirement.name)
            if key == "trajcore":
                continue
            if key not in wanted:
                wanted.add(key)
                pending.append((requirement.name, frozenset(requirement.extras)))
    return wanted


def _normalize(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _loaded_distributions(*modules: str) -> dict[str, str]:
    """Third-party top-level modules that importing ``modules`` in a fresh interpreter loads,
    each mapped to its distribution's normalized name."""
    # what the interpreter loads before any import (``.pth`` hooks of site-packages) is left
    # out, and so are modules with no file (made at run time, e.g. by Cython extensions) and
    # the standard library's own files
    probe = (
        "import importlib, json, sys, sysconfig\n"
        "before = set(sys.modules)\n"
        f"for name in {list(modules)!r}: importlib.import_module(name)\n"
        "base = {'base': sys.base_prefix, 'platbase': sys.base_exec_prefix}\n"
        "std = tuple(sysconfig.get_paths(vars=base)[k] for k in ('stdlib', 'platstdlib'))\n"
        "files = {n: getattr(m, '__file__', None) for n, m in list(sys.modules.items())}\n"
        "new = [n for n in set(files) - before if files[n] and not files[n].startswith(std)]\n"
        "print(json.dumps(sorted({n.split('.')[0] for n in new})))\n"
    )
    done = subprocess.run(
        [sys.executable, "-I", "-c", probe],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, f"importing {modules} failed:\n{done.stderr}"
    tops = set(json.loads(done.stdout)) - set(sys.stdlib_module_names)
    owners = importlib.metadata.packages_distributions()
    found: dict[str, str] = {}
    for top in sorted(tops - {"trajcore"}):
        assert top in owners, f"{modules} loaded {top!r}, which no installed distribution owns"
        found[top] = _normalize(owners[top][0])
    return found


CORE_MODULES = sorted(
    {
        "trajcore",
        "trajcore.entrypoints.cli",
        "trajcore.entrypoints.slot_server",
        "trajcore.adapters.removal",
        *_submodules("trajcore.adapters.slot_server"),
        *_submodules("trajcore.adapters.pools"),
        *_submodules("trajcore.domain"),
        *_submodules("trajcore.ports"),
        *_submodules("trajcore.rollout"),
    }
    - {"trajcore.adapters.pools.modal_sdk", "trajcore.adapters.pools.daytona_sdk"}
)
# each cloud provider's SDK sits behind one module, which needs only that provider's extra
# (the pools themselves, modal_pool and daytona_pool, import it lazily: they are core modules)
CLOUD_MODULES = [
    ("trajcore.adapters.pools.modal_sdk", "modal", "modal"),
    ("trajcore.adapters.pools.daytona_sdk", "daytona", "daytona"),
]


@pytest.mark.parametrize("module", CORE_MODULES)
def test_a_core_module_loads_only_the_core_dependencies(module: str) -> None:
    allowed = _closure(frozenset()) | OPTIONAL_OF_CORE
    loaded = _loaded_distributions(module)
    outside = {top: dist for top, dist in loaded.items() if dist not in allowed}
    assert not outside, f"{module} loads modules of distributions outside the core: {outside}"
    assert not TRAINER_STACK & set(loaded)


@pytest.mark.parametrize(("module", "extra", "sdk"), CLOUD_MODULES)
def test_a_cloud_sdk_module_loads_its_sdk_and_no_trainer(module: str, extra: str, sdk: str) -> None:
    """What else an SDK loads is its own affair (both import optional packages when present,
    and ``google`` is a namespace several distributions share), so this checks the two things
    that matter: the module loads its SDK, and nothing of the trainer stack."""
    if importlib.util.find_spec(sdk) is None:
        pytest.skip(f"the {sdk} SDK is not installed (pip install 'trajcore[{extra}]')")
    loaded = set(_loaded_distributions(module).values())
    assert sdk in loaded
    assert not {"atroposlib", "transformers", "tokenizers", "torch"} & loaded, loaded


def test_the_domain_loads_nothing_but_attrs() -> None:
    loaded = set(_loaded_distributions(*_submodules("trajcore.domain")).values())
    assert loaded <= {"attrs"}, loaded


def test_the_check_sees_a_module_of_the_trainer_stack() -> None:
    # control: the env module does load the trainer stack, and the trace names it
    loaded = _loaded_distributions("trajcore.env")
    assert {"atroposlib", "transformers"} <= set(loaded.values())
    assert not set(loaded.values()) <= _closure(frozenset())


def test_the_core_is_small() -> None:
    core = _closure(frozenset())
    assert {"attrs", "cattrs", "anyio", "jsonschema"} <= core
    assert len(core) + 1 <= 20, sorted(core)  # + trajcore itself


_WITHOUT_NOMAD = """
import sys

class NoNomad:  # as where python-nomad is not installed (the atropos extra without nomad)
    def find_spec(self, name, path=None, target=None):
        if name == "nomad" or name.startswith("nomad."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, NoNomad())
import trajcore.env
import trajcore.entrypoints.run
import trajcore.entrypoints.demo
from trajcore.adapters.pools.nomad_client import NomadClient
from trajcore.domain.errors import SandboxUnavailable
try:
    NomadClient(address="http://127.0.0.1:4646")
except SandboxUnavailable as error:
    print(error)
"""


def test_an_env_imports_without_python_nomad_and_a_nomad_pool_names_its_extra() -> None:
    """python-nomad comes with the ``nomad`` extra only: an env installed with ``atropos``
    imports, and only a Nomad pool, when made, needs it, naming the extra to install."""
    done = subprocess.run(
        [sys.executable, "-c", _WITHOUT_NOMAD], capture_output=True, text=True, timeout=300,
        check=False, env={**__import__("os").environ, "HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-2000:]
    assert "install trajcore[nomad]" in done.stdout
