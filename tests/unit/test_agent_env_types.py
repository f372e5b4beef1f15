"""The typed faces of atroposlib's bases declare only what atroposlib has, with its defaults."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

import atroposlib.envs.base as atropos_base  # type: ignore[import-untyped]

import trajcore.entrypoints.atropos_bases as faces


def _declared() -> dict[str, dict[str, ast.stmt]]:
    tree = ast.parse(Path(faces.__file__).read_text())
    out: dict[str, dict[str, ast.stmt]] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            members: dict[str, ast.stmt] = {}
            for item in node.body:
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                    members[item.target.id] = item
                elif isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef):
                    members[item.name] = item
            out[node.name] = members
    return out


def test_every_config_field_is_atroposlibs_with_its_default() -> None:
    declared = _declared()["BaseEnvConfig"]
    real = atropos_base.BaseEnvConfig.model_fields
    assert set(declared) == set(real)
    for name, node in declared.items():
        assert isinstance(node, ast.AnnAssign)
        assert node.value is not None
        default = ast.literal_eval(node.value)
        if name != "eval_handling":  # an enum there; typed as object here
            assert default == real[name].default, name


def test_every_env_member_exists_in_atroposlib() -> None:
    source = inspect.getsource(atropos_base)
    for name, node in _declared()["BaseEnv"].items():
        if isinstance(node, ast.AnnAssign):
            # A class attribute, or one atroposlib sets on the env (its own or the CLI's).
            assigned = f"self.{name} =" in source or f"env.{name} =" in source
            assert hasattr(atropos_base.BaseEnv, name) or assigned, name
        else:
            assert callable(getattr(atropos_base.BaseEnv, name)), name
