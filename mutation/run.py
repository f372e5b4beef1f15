"""``./dev mutate``: mutation testing of one module (or the full profile) against its own tests.

For each module it makes a working folder under ``build/mutation/`` holding links to ``src`` and
``tests`` and a ``pyproject.toml`` that is the project's with a ``[tool.mutmut]`` table naming
that one module and its tests (``mutation/modules.toml``), runs ``mutmut run`` there from fresh
(mutmut copies the tree into ``mutants/`` and never touches ``src``), then reads every mutant's
status and diff and reports the ones the tests missed by file and line. Mutants listed in
``mutation/equivalent.toml`` (the same function, original line and mutated line) are counted
apart: they change no behaviour, so no test can kill them.

Results accumulate in ``build/mutation/results.json``; the report (``build/mutation/report.md``
unless ``--report`` says otherwise) covers the modules of this run, or with ``--summary`` the
last stored result of every module of the profile.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import fcntl
import fnmatch
import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "src" / "trajcore"
CONFIG = REPO / "mutation" / "modules.toml"
EQUIVALENT = REPO / "mutation" / "equivalent.toml"
BUILD = REPO / "build" / "mutation"
RESULTS = BUILD / "results.json"

# mutmut stops a mutant's tests after (t + TIMEOUT_CONSTANT) x TIMEOUT_MULTIPLIER seconds of wall
# time (and twice that of CPU time), t being their measured time in the clean run; a hung mutant
# counts as detected ("timeout"). The constant covers the fork and pytest's own work per mutant
# on a busy machine (with mutmut's 1 s, quick modules' mutants were cut off as they ran). A hang
# is stopped sooner, by CPU time, in the test that hangs (mutation/plugin.py); this wall limit is
# the backstop, and its multiplier of 2 keeps a mutant the tests miss, which runs them all in
# about t, from being taken for a hang while the shared machine is busy.
TIMEOUT_MULTIPLIER = 2.0
TIMEOUT_CONSTANT = 10.0

# mutmut's statuses, grouped: a mutant the tests noticed, one they missed, one not judged.
DETECTED = {"killed", "timeout", "segfault", "caught by type check"}
MISSED = {"survived", "no tests", "suspicious"}


# ------------------------------------------------------------------------------ configuration


def load_config() -> dict[str, Any]:
    with CONFIG.open("rb") as f:
        return tomllib.load(f)


def module_key(name: str) -> str:
    """``domain/groups``, ``domain/groups.py``, ``src/trajcore/domain/groups.py`` or
    ``trajcore.domain.groups`` as ``domain/groups.py``; exits naming a module that is not there."""
    key = name.strip()
    if key.startswith("trajcore.") or ("/" not in key and not key.endswith(".py")):
        key = key.removeprefix("trajcore.").replace(".", "/") + ".py"
    key = key.removeprefix("src/").removeprefix("trajcore/")
    if not key.endswith(".py"):
        key += ".py"
    if not (PACKAGE / key).is_file():
        if (PACKAGE / key.removesuffix(".py") / "__init__.py").is_file():
            key = key.removesuffix(".py") + "/__init__.py"
        else:
            sys.exit(f"./dev mutate: no module {name!r} (looked for src/trajcore/{key})")
    return key


def tests_for(key: str, config: dict[str, Any]) -> list[str]:
    table: dict[str, list[str]] = config["tests"]
    if key in table:
        return table[key]
    for pattern, args in table.items():
        if fnmatch.fnmatch(key, pattern):
            return args
    sys.exit(
        f"./dev mutate: mutation/modules.toml names no tests for {key}; add the module's own "
        "test files under [tests]"
    )


def profile_modules(config: dict[str, Any]) -> list[str]:
    found: set[str] = set()
    for pattern in config["profile"]["include"]:
        found.update(str(p.relative_to(PACKAGE)) for p in PACKAGE.glob(pattern) if p.is_file())
    return sorted(found)


def load_equivalents() -> list[dict[str, str]]:
    if not EQUIVALENT.is_file():
        return []
    with EQUIVALENT.open("rb") as f:
        entries: list[dict[str, str]] = tomllib.load(f).get("equivalent", [])
    for i, entry in enumerate(entries):
        missing = {"module", "function", "original", "mutant", "why"} - set(entry)
        if missing:
            sys.exit(f"./dev mutate: mutation/equivalent.toml entry {i} lacks {sorted(missing)}")
    return entries


# ------------------------------------------------------------------------------ what a run saw

# Besides the module and its tests, what decides which mutants the tests kill: the per-test stop
# and ordering (plugin.py), the pinned versions of mutmut, pytest and hypothesis, and the limits
# and statuses above (``_TOOLCHAIN_SETTINGS``). The reporting below changes no kill.
TOOLCHAIN = ("mutation/plugin.py", "requirements.lock")
_TOOLCHAIN_SETTINGS = json.dumps(
    [TIMEOUT_MULTIPLIER, TIMEOUT_CONSTANT, sorted(DETECTED), sorted(MISSED)]
)


def _digest(root: Path, paths: list[str], extra: str = "") -> str:
    h = hashlib.sha256(extra.encode())
    for rel in sorted(set(paths)):
        h.update(b"\0" + rel.encode() + b"\0")
        target = root / rel
        h.update(target.read_bytes() if target.is_file() else b"<missing>")
    return h.hexdigest()[:16]


def selected_files(tests: list[str], root: Path = REPO) -> list[str]:
    """The files a module's pytest arguments select (a file, a file's node, a folder's test files),
    with every ``conftest.py`` from ``tests/`` down to each of them: what those tests run."""
    found: set[str] = set()
    for arg in tests:
        path = root / arg.partition("::")[0]
        if arg.startswith("-") or not path.exists():
            continue  # an option, or the value of one (``-k`` ...)
        files = sorted(path.rglob("test_*.py")) if path.is_dir() else [path]
        for file in files:
            found.add(str(file.relative_to(root)))
            folder = file.parent
            while folder != root and folder.is_relative_to(root / "tests"):
                if (folder / "conftest.py").is_file():
                    found.add(str((folder / "conftest.py").relative_to(root)))
                folder = folder.parent
    return sorted(found)


def fingerprint(key: str, tests: list[str], root: Path = REPO) -> dict[str, str]:
    """Digests of what a run of ``key`` saw: its source, its tests (their files and the
    arguments selecting them) and the toolchain. A stored run is current while all three match."""
    return {
        "module": _digest(root, [f"src/trajcore/{key}"]),
        "tests": _digest(root, selected_files(tests, root), json.dumps(tests)),
        "toolchain": _digest(root, list(TOOLCHAIN), _TOOLCHAIN_SETTINGS),
    }


def staleness(stored: dict[str, Any], key: str, tests: list[str], root: Path = REPO) -> str:
    """Why ``stored`` (a module's last stored run) does not stand for its module as it is now,
    or ``""`` when it does."""
    seen = stored.get("fingerprint")
    if not isinstance(seen, dict):
        return "run before fingerprints were kept"
    now = fingerprint(key, tests, root)
    changed = [part for part in ("module", "tests", "toolchain") if seen.get(part) != now[part]]
    if changed:
        return {
            "module": "the module changed since",
            "tests": "its tests changed since",
            "toolchain": "the toolchain changed since",
        }[changed[0]]
    if not stored.get("complete"):
        return "cut short"
    return ""


def revision(root: Path = REPO) -> str:
    """The commit a run started at, with ``+`` when the tree had uncommitted changes."""

    def git(*words: str) -> str:
        done = subprocess.run(
            ["git", *words], cwd=root, capture_output=True, text=True, check=True, timeout=30
        )
        return done.stdout.strip()

    try:
        head = git("rev-parse", "--short=12", "HEAD")
        dirty = git("status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return head + ("+" if dirty else "")


def rejudged(result: dict[str, Any]) -> dict[str, Any]:
    """A stored run with its missed mutants judged again against ``mutation/equivalent.toml`` as
    it is now, so an entry added or removed there shows without a rerun."""
    entries = load_equivalents()
    equivalent: list[dict[str, Any]] = []
    survivors: list[dict[str, Any]] = []
    for m in [*result.get("survivors", []), *result.get("equivalents", [])]:
        why = is_equivalent(result["module"], m, entries)
        if why:
            equivalent.append({**m, "why": why})
        else:
            survivors.append({k: v for k, v in m.items() if k != "why"})
    judged = result["killed"] + len(survivors)
    return {
        **result,
        "survivors": survivors,
        "equivalents": equivalent,
        "equivalent": len(equivalent),
        "missed": len(survivors),
        "rate": result["killed"] / judged if judged else 1.0,
    }


# ------------------------------------------------------------------------------ running mutmut


def slug(key: str) -> str:
    return key.removesuffix(".py").replace("/", ".")


def prepare(key: str, tests: list[str]) -> Path:
    """A fresh working folder for ``key`` with its own ``[tool.mutmut]``."""
    work = BUILD / slug(key)
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    (work / "src").symlink_to(REPO / "src")
    (work / "tests").symlink_to(REPO / "tests")
    (work / "mutation").symlink_to(REPO / "mutation")
    project = (REPO / "pyproject.toml").read_text()
    if "[tool.mutmut]" in project:
        sys.exit(
            "./dev mutate: pyproject.toml has its own [tool.mutmut]; modules.toml is the place"
        )
    table = "\n".join(
        [
            "",
            "# ---------------------------------------------------------------- mutmut (generated)",
            "[tool.mutmut]",
            'source_paths = ["src"]',
            f"only_mutate = [{json.dumps('src/trajcore/' + key)}]",
            f"pytest_add_cli_args_test_selection = {json.dumps(tests)}",
            'also_copy = ["mutation/"]',
            'pytest_add_cli_args = ["-p", "no:cacheprovider", "-p", "mutation.plugin"]',
            # A mutant that hangs (an endless loop) is stopped after t + 10 s, t being the
            # measured time of the tests that reach it: mutmut's own (t + 1 s) x 15 made that
            # up to an hour for a parser's shared helpers, whose tests are the properties of
            # every family. A mutant the tests miss runs them in about t.
            f"timeout_multiplier = {TIMEOUT_MULTIPLIER}",
            f"timeout_constant = {TIMEOUT_CONSTANT}",
            "",
        ]
    )
    (work / "pyproject.toml").write_text(project + table)
    return work


def run_mutmut(work: Path, jobs: int, limit_s: float | None) -> tuple[int, float]:
    """``mutmut run`` in ``work``; its output goes to ``work/mutmut.log``. Returns the exit
    status (``-1`` when it ran past ``limit_s`` and was stopped) and the seconds it took."""
    env = dict(os.environ)
    env.setdefault("HYPOTHESIS_PROFILE", "ci")
    started = time.monotonic()
    with (work / "mutmut.log").open("w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "mutmut", "run", "--max-children", str(jobs)],
            cwd=work,
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        try:
            code = proc.wait(timeout=limit_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            code = -1
        except KeyboardInterrupt:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            raise
    return code, time.monotonic() - started


# Runs inside the working folder (``collect``): every mutant's status and diff, as JSON.
def collect_here() -> None:
    from mutmut.mutation.data import SourceFileMutationData
    from mutmut.mutation.diff_apply import get_diff_for_mutant
    from mutmut.stats import status_by_exit_code
    from mutmut.utils.file_utils import walk_mutatable_files

    out: dict[str, dict[str, str]] = {}
    for path in walk_mutatable_files():
        data = SourceFileMutationData(path=path)
        data.load()
        for name, exit_code in data.exit_code_by_key.items():
            status = status_by_exit_code[exit_code]
            # a timeout's diff too: the report lists the stopped mutants, to be judged
            judged = status in DETECTED and status != "timeout"
            diff = "" if judged else get_diff_for_mutant(name, path=path)
            out[name] = {"status": status, "diff": diff}
    json.dump(out, sys.stdout)


def collect(work: Path) -> dict[str, dict[str, str]]:
    done = subprocess.run(
        [sys.executable, str(Path(__file__).resolve()), "collect"],
        cwd=work,
        capture_output=True,
        text=True,
        check=True,
    )
    result: dict[str, dict[str, str]] = json.loads(done.stdout)
    return result


# ------------------------------------------------------------------------------ reading mutants


def function_of(name: str) -> str:
    """``trajcore.m.xǁClassǁmethod__mutmut_3`` -> ``Class.method``; ``x_func__mutmut_1`` ->
    ``func``."""
    mangled = name.rpartition("__mutmut_")[0].rpartition(".")[2]
    if mangled.startswith("xǁ"):
        return ".".join(mangled[2:].split("ǁ"))
    return mangled.removeprefix("x_")


def function_start(source: str, function: str) -> tuple[int, int]:
    """The first line (decorators included) and the last line of ``function`` in ``source``."""
    import ast

    tree = ast.parse(source)
    *owner, name = function.split(".")
    body: list[ast.stmt] = tree.body
    for cls in owner:
        body = next(n.body for n in body if isinstance(n, ast.ClassDef) and n.name == cls)
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.name == name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            return first, node.end_lineno or node.lineno
    raise LookupError(function)


_HUNK = re.compile(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@")


def changed_lines(diff: str) -> tuple[int, list[str], list[str]]:
    """The 1-based line in the function's text of the first removed line, and the removed and
    added lines of a mutant's diff."""
    first = 0
    removed: list[str] = []
    added: list[str] = []
    line = 0
    for text in diff.splitlines():
        if text.startswith(("---", "+++")):
            continue
        hunk = _HUNK.match(text)
        if hunk:
            line = int(hunk.group(1))
        elif text.startswith("-"):
            if not first:
                first = line
            removed.append(text[1:])
            line += 1
        elif text.startswith("+"):
            added.append(text[1:])
        else:
            line += 1
    return first, removed, added


def locate(source_lines: list[str], start: int, end: int, offset: int, removed: str) -> int:
    """The file line of a mutant's first removed line: ``offset`` lines into the function's
    text (which may open with comment lines above its first line), checked against the text."""
    want = removed.strip()
    candidates = range(max(1, start - 40), min(len(source_lines), end) + 1)
    matches = [n for n in candidates if source_lines[n - 1].strip() == want]
    guess = start + offset - 1
    if not matches:
        return guess
    return min(matches, key=lambda n: abs(n - guess))


def describe(
    key: str, mutants: dict[str, dict[str, str]], statuses: set[str] | None = None
) -> list[dict[str, Any]]:
    """The mutants of ``statuses`` (unless told, every one judged and not detected), each with
    its function, line, original and mutated code."""
    source = (PACKAGE / key).read_text()
    lines = source.splitlines()
    out = []
    for name, entry in mutants.items():
        status = entry["status"]
        if statuses is None:
            wanted = status not in DETECTED and status != "not checked"
        else:
            wanted = status in statuses
        if not wanted:
            continue
        function = function_of(name)
        offset, removed, added = changed_lines(entry["diff"])
        try:
            start, end = function_start(source, function)
            # the function's text as mutmut prints it opens at its first comment line, if any
            lead = _leading_comment_lines(lines, start)
            line = locate(lines, start - lead, end, offset, removed[0] if removed else "")
        except (LookupError, StopIteration, SyntaxError):
            line = 0
        out.append(
            {
                "name": name,
                "status": entry["status"],
                "function": function,
                "line": line,
                "original": " ".join(r.strip() for r in removed),
                "mutant": " ".join(a.strip() for a in added),
            }
        )
    out.sort(key=lambda m: (m["line"], m["name"]))
    return out


def _leading_comment_lines(lines: list[str], start: int) -> int:
    n = 0
    while start - n - 2 >= 0 and lines[start - n - 2].strip().startswith("#"):
        n += 1
    return n


def is_equivalent(key: str, missed: dict[str, Any], entries: list[dict[str, str]]) -> str | None:
    for entry in entries:
        if (
            entry["module"] == key
            and entry["function"] == missed["function"]
            and entry["original"] == missed["original"]
            and entry["mutant"] == missed["mutant"]
        ):
            return entry["why"]
    return None


# ------------------------------------------------------------------------------ reporting


def stopped_in(work: Path) -> dict[str, dict[str, Any]]:
    """The mutants the plugin stopped for CPU time, by name: the test and the limit."""
    path = work / "mutants" / "stopped.jsonl"
    if not path.is_file():
        return {}
    records = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["mutant"]: r for r in records}


def summarise(
    key: str,
    tests: list[str],
    mutants: dict[str, dict[str, str]],
    code: int,
    seconds: float,
    *,
    stopped: dict[str, dict[str, Any]] | None = None,
) -> dict[str, Any]:
    entries = load_equivalents()
    statuses = [m["status"] for m in mutants.values()]
    missed = describe(key, mutants)
    equivalent: list[dict[str, Any]] = []
    survivors: list[dict[str, Any]] = []
    for m in missed:
        why = is_equivalent(key, m, entries)
        (equivalent if why else survivors).append({**m, "why": why} if why else m)
    timeouts = describe(key, mutants, {"timeout"})
    for m in timeouts:
        by = (stopped or {}).get(m["name"].replace("__init__.", ""))
        m["stopped"] = (
            f"{by['test']} past {by['cpu_limit_s']} s of CPU" if by else "mutmut's wall limit"
        )
    detected = sum(s in DETECTED for s in statuses)
    judged = detected + len(survivors)
    return {
        "module": key,
        "tests": tests,
        "date": datetime.date.today().isoformat(),
        "seconds": round(seconds),
        "complete": code == 0 and "not checked" not in statuses,
        "mutants": len(statuses),
        "killed": detected,
        "equivalent": len(equivalent),
        "missed": len(survivors),
        "not_checked": statuses.count("not checked"),
        "timeout": len(timeouts),
        "rate": detected / judged if judged else 1.0,
        "survivors": survivors,
        "equivalents": equivalent,
        "timeouts": timeouts,
    }


def store(result: dict[str, Any]) -> None:
    """Adds ``result`` to the stored runs; runs of other modules may store at the same time."""
    with (BUILD / "results.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        stored: dict[str, Any] = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
        stored[result["module"]] = result
        part = RESULTS.with_suffix(".json.part")
        part.write_text(json.dumps(stored, indent=1, sort_keys=True))
        part.replace(RESULTS)


def report(
    results: list[dict[str, Any]],
    target: float,
    missing: list[str],
    stale: dict[str, str] | None = None,
) -> str:
    """The table of ``results`` and every missed and hung mutant. With ``stale`` (the
    ``--summary`` of stored runs) a column says whether each row's run was of its module and
    tests as they are now."""
    rows = [
        "| module | mutants | killed | equivalent | missed | kill rate | target |"
        + (" run of the code as it is | run at |" if stale is not None else ""),
        "|---|---|---|---|---|---|---|" + ("---|---|" if stale is not None else ""),
    ]
    for r in results:
        verdict = "met" if r["rate"] >= target else "NOT met"
        if not r["complete"]:
            verdict = f"not known (incomplete: {r['not_checked']} not checked)"
        row = (
            f"| {r['module']} | {r['mutants']} | {r['killed']} | {r['equivalent']} | "
            f"{r['missed']} | {100 * r['rate']:.1f}% | {verdict} |"
        )
        if stale is not None:
            why = stale.get(r["module"], "")
            row += f" {'yes' if not why else 'NO: ' + why} | {r['date']} {r.get('revision', '')} |"
        rows.append(row)
    text = [
        f"# Mutation testing (mutmut), {datetime.date.today().isoformat()}",
        "",
        f"Target: {100 * target:.0f}% of the non-equivalent mutants killed by each module's own "
        "tests (mutation/modules.toml).",
        "",
        *rows,
    ]
    if stale is not None:
        current = [r for r in results if not stale.get(r["module"])]
        text += [
            "",
            f"{len(current)} of {len(results) + len(missing)} modules' stored runs are of their "
            "module, tests and toolchain as they are now.",
        ]
    if missing:
        text += ["", "Not run: " + ", ".join(missing)]
    text += ["", "## Mutants the tests missed (file:line, function, original -> mutant)", ""]
    for r in results:
        for m in r["survivors"]:
            text.append(
                f"- src/trajcore/{r['module']}:{m['line']} `{m['function']}` ({m['status']}): "
                f"`{m['original']}` -> `{m['mutant']}`"
            )
    text += ["", "## Mutants stopped as hung, counted as detected (file:line, function, by)", ""]
    for r in results:
        for m in r.get("timeouts", []):
            text.append(
                f"- src/trajcore/{r['module']}:{m['line']} `{m['function']}` ({m['stopped']}): "
                f"`{m['original']}` -> `{m['mutant']}`"
            )
    return "\n".join(text) + "\n"


# What mutmut says when no selected test reaches any mutant (with no mutant at all, too).
_NOTHING_TO_TEST = "could not find any test case for any mutant"


@contextlib.contextmanager
def module_lock(key: str) -> Iterator[bool]:
    """Held while a run of ``key`` uses its working folder; yields False when another run
    holds it (two runs of one module would wipe each other's folder)."""
    BUILD.mkdir(parents=True, exist_ok=True)
    with (BUILD / f"{slug(key)}.lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        try:
            yield True
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def run_module(
    key: str, config: dict[str, Any], jobs: int, limit_s: float | None
) -> dict[str, Any]:
    tests = tests_for(key, config)
    seen, at = fingerprint(key, tests), revision()
    work = prepare(key, tests)
    print(f"== {key}: mutmut over {' '.join(tests)} (log: {work.relative_to(REPO)}/mutmut.log)")
    sys.stdout.flush()
    code, seconds = run_mutmut(work, jobs, limit_s)
    mutants = collect(work) if (work / "mutants").is_dir() else {}
    log = (work / "mutmut.log").read_text(errors="replace")
    if code == 1 and not mutants and _NOTHING_TO_TEST in log:
        # A module of constants and tables only (``kernel_masks``): mutmut made no mutant, then
        # stops saying no test reaches one. Nothing to kill is a complete run, not a failure.
        code = 0
    if code not in (0, -1):
        print(log[-3000:])
        print(f"   mutmut failed (exit {code}); see the log")
    result = summarise(key, tests, mutants, code, seconds, stopped=stopped_in(work))
    if fingerprint(key, tests) != seen:
        # the module or its tests were edited while it ran: the result stands for neither
        print("   the module or its tests changed during the run: stored as not current")
        seen = {**seen, "module": "changed during the run"}
    result = {**result, "fingerprint": seen, "revision": at}
    store(result)
    print(
        f"   {result['mutants']} mutants: {result['killed']} killed, {result['equivalent']} "
        f"equivalent, {result['missed']} missed ({result['timeout']} of the killed stopped as "
        f"hung) -> {100 * result['rate']:.1f}% in "
        f"{result['seconds']} s{'' if result['complete'] else ' (INCOMPLETE)'}"
    )
    for m in result["survivors"]:
        where = f"src/trajcore/{key}:{m['line']} {m['function']}"
        print(f"   {where}: {m['original']!r} -> {m['mutant']!r}")
    return result


def run_each(
    keys: list[str], config: dict[str, Any], jobs: int, limit_s: float | None, *, resumed: bool
) -> list[dict[str, Any]]:
    """Runs each module in turn. ``resumed`` (``--all --stale``): just before its turn a module
    whose stored run has become current meanwhile (another run did it) is not run again."""
    results = []
    for key in keys:
        with module_lock(key) as held:
            if not held:
                print(f"== {key}: another run of it is going on; left to that run")
                continue
            if resumed:
                # a long resumed run: what others ran or changed meanwhile decides, not the list
                config = load_config()
                now = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
                if key in now and not staleness(now[key], key, tests_for(key, config)):
                    print(f"== {key}: its stored run is current by now; not run again")
                    results.append(now[key])
                    continue
            results.append(run_module(key, config, jobs, limit_s))
    return results


def summary(config: dict[str, Any], stored: dict[str, Any], path: Path) -> int:
    """``--summary``: every module's last stored run, judged against the equivalents as they are
    and marked current or not; 0 only when every module's run is current and meets the target."""
    target = float(config["profile"]["target"])
    keys = profile_modules(config)
    results = [rejudged(stored[k]) for k in keys if k in stored]
    stale = {
        r["module"]: staleness(r, r["module"], tests_for(r["module"], config)) for r in results
    }
    missing = [k for k in keys if k not in stored]
    text = report(results, target, missing, stale)
    path.write_text(text)
    print(text)
    whole = not missing and not any(stale.values())
    return 0 if whole and all(r["rate"] >= target for r in results) else 1


def main() -> int:
    if sys.argv[1:2] == ["collect"]:
        collect_here()
        return 0
    parser = argparse.ArgumentParser(prog="./dev mutate", description=__doc__.split("\n")[0])
    parser.add_argument(
        "modules", nargs="*", help="e.g. domain/groups.py or trajcore.domain.groups"
    )
    parser.add_argument("--all", action="store_true", help="every module of the profile")
    parser.add_argument(
        "--stale",
        action="store_true",
        help="with --all: only the modules whose last stored run is not of their module, tests "
        "and toolchain as they are now, or was cut short (a full run, resumed)",
    )
    parser.add_argument("--list", action="store_true", help="the profile's modules and tests")
    parser.add_argument(
        "--summary", action="store_true", help="report the last stored result of each module"
    )
    parser.add_argument("--jobs", type=int, default=1, help="mutants tested at once (default 1)")
    parser.add_argument(
        "--max-minutes", type=float, default=None, help="stop a module's run after this long"
    )
    parser.add_argument("--report", type=Path, default=BUILD / "report.md")
    args = parser.parse_args()
    config = load_config()
    target = float(config["profile"]["target"])
    BUILD.mkdir(parents=True, exist_ok=True)
    if args.list:
        for key in profile_modules(config):
            print(f"{key}: {' '.join(tests_for(key, config))}")
        return 0
    stored = json.loads(RESULTS.read_text()) if RESULTS.is_file() else {}
    if args.summary:
        return summary(config, stored, args.report)
    if args.stale and not args.all:
        parser.error("--stale goes with --all")
    keys = profile_modules(config) if args.all else [module_key(m) for m in args.modules]
    if args.stale:
        keys = [k for k in keys if k not in stored or staleness(stored[k], k, tests_for(k, config))]
        print(f"{len(keys)} modules of the profile to run: {' '.join(keys) or '(none)'}")
        if not keys:
            return 0
    if not keys:
        parser.error("name a module (e.g. domain/groups.py), or --all")
    for key in keys:
        tests_for(key, config)  # every module has tests before anything runs
    limit = args.max_minutes * 60 if args.max_minutes else None
    results = run_each(keys, config, args.jobs, limit, resumed=args.stale)
    text = report(results, target, [])
    args.report.write_text(text)
    print(f"\nreport: {args.report}")
    met = all(r["rate"] >= target and r["complete"] for r in results)
    return 0 if met else 1


if __name__ == "__main__":
    sys.exit(main())
