"""The wheel's build hook: compile the slot helper (``slot_helper.c``) into the wheel.

A wheel built where a C compiler is present ships ``trajcore/adapters/slot_server/_native/slot-helper``
and the SHA-256 of the source it came from; slot servers installed from it use that binary and
need no compiler (``native_helper.build_slot_helper`` looks for it first). The compiler, the flags
and the static link are ``native_helper``'s own (loaded here by path: it imports only the standard
library), so the wheel's binary and a run-time build are the same program.

Rules:
- Editable installs (source checkouts) ship nothing: they build at run time, into the cache.
- No compiler: the wheel is built pure, without the binary, and a warning says so; with
  ``TRAJCORE_REQUIRE_SLOT_HELPER=1`` (the image's build stage sets it) that is an error.
- A compiler that fails (``-Werror`` included) fails the build: a wheel never hides a broken
  helper behind the Python fallback.
- With the binary the wheel is platform-specific (``py3-none-<platform>``: the binary needs no
  particular Python).
"""

from __future__ import annotations

import importlib.util
import os
import sys
import sysconfig
import tempfile
from pathlib import Path
from types import ModuleType
from typing import Any

from hatchling.builders.hooks.plugin.interface import BuildHookInterface

HERE = Path(__file__).resolve().parent
NATIVE_HELPER = HERE / "src" / "trajcore" / "adapters" / "slot_server" / "native_helper.py"
SHIPPED = "trajcore/adapters/slot_server/_native"


def _native_helper() -> ModuleType:
    spec = importlib.util.spec_from_file_location("_trajcore_native_helper", NATIVE_HELPER)
    if spec is None or spec.loader is None:
        raise RuntimeError(f"cannot load {NATIVE_HELPER}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


class SlotHelperBuildHook(BuildHookInterface):  # type: ignore[misc]  # hatchling ships no types
    """Compile the slot helper into a standard wheel (see the module docstring)."""

    PLUGIN_NAME = "custom"

    def initialize(self, version: str, build_data: dict[str, Any]) -> None:
        if self.target_name != "wheel" or version == "editable":
            return
        native = _native_helper()
        required = os.environ.get("TRAJCORE_REQUIRE_SLOT_HELPER") == "1"
        try:
            compiler = native._compiler()
        except native.NativeBuildError as error:
            if required:
                raise RuntimeError(f"TRAJCORE_REQUIRE_SLOT_HELPER=1 and {error}") from None
            self.app.display_warning(
                f"trajcore: building a wheel without the compiled slot helper ({error}); "
                "slot servers from it build the helper at run time or use the Python fallback"
            )
            return
        self._workdir = tempfile.TemporaryDirectory(prefix="trajcore-slot-helper-")
        target = Path(self._workdir.name) / "slot-helper"
        native.compile_slot_helper(target, compiler=compiler)
        build_data["force_include"][str(target)] = f"{SHIPPED}/slot-helper"
        build_data["force_include"][str(target.with_name("slot-helper.sha256"))] = (
            f"{SHIPPED}/slot-helper.sha256"
        )
        # the binary needs no particular Python, only this platform
        build_data["pure_python"] = False
        build_data["tag"] = (
            f"py3-none-{sysconfig.get_platform().replace('-', '_').replace('.', '_')}"
        )
        self.app.display_info(f"trajcore: compiled the slot helper with {compiler[0]}")

    def finalize(self, version: str, build_data: dict[str, Any], artifact_path: str) -> None:
        workdir = getattr(self, "_workdir", None)
        if workdir is not None:
            workdir.cleanup()
