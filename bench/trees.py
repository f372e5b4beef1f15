"""The call path of two revisions side by side on this machine: did a change cost throughput?

Each revision is checked out into a temporary git worktree and ``bench/call_path.py`` (this
tree's) runs against its ``src``, alternating base and head ``--pairs`` times for each path
(pool, direct client) and each number of trajectories, so that the machine's drift and other
work load both alike. Absolute rates are compared, not ratios to a reference measured in
between: a ratio carries the reference's own noise twice.

Printed per row: each revision's mean and median calls per second over every round, head /
base of the means, and the verdict against the bar the containment work was held to (no
figure more than 10% below the base). Every figure is measured in this run.

Run: ``.venv/bin/python bench/trees.py [--base REV] [--head REV] [--levels 1,8,64]
[--pairs 3] [--seconds 2] [--base-driver FILE]``: by default HEAD's parent against HEAD.
``--head .`` measures the working tree as it is, uncommitted changes included. A base older than
the modules ``call_path.py`` imports (the slot server and pools split into their packages, the
pool settings composed) runs ``--base-driver``: a copy of ``call_path.py`` with that revision's
import paths and settings, its measurement unchanged; the run prints the lines that differ.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DRIVER = REPO / "bench" / "call_path.py"
BAR = 0.90


def worktree(rev: str, into: Path) -> Path:
    """A checkout of ``rev`` under ``into`` (``.``: this working tree itself)."""
    if rev == ".":
        return REPO
    path = into / rev.replace("/", "_").replace("~", "-").replace("^", "-")
    subprocess.run(
        ["git", "-C", str(REPO), "worktree", "add", "--detach", "--quiet", str(path), rev],
        check=True,
    )
    return path


def measure(
    tree: Path, path: str, trajectories: int, seconds: float, driver: Path = DRIVER
) -> list[float]:
    environment = {**os.environ, "PYTHONPATH": str(tree / "src")}
    done = subprocess.run(
        [sys.executable, str(driver), path, str(trajectories), "--seconds", str(seconds),
         "--rounds", "3"],
        env=environment, capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    if done.returncode != 0:
        raise SystemExit(f"{tree}: call_path {path} {trajectories} failed:\n{done.stderr[-2000:]}")
    return [float(json.loads(line)["calls_per_s"]) for line in done.stdout.splitlines()]


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n", 1)[0])
    parser.add_argument("--base", default="HEAD~1")
    parser.add_argument("--head", default="HEAD")
    parser.add_argument("--levels", default="1,8,64", help="trajectories, comma-separated")
    parser.add_argument("--pairs", type=int, default=3, help="alternations per row")
    parser.add_argument("--seconds", type=float, default=2.0, help="per round (3 per run)")
    parser.add_argument(
        "--base-driver", type=Path, default=DRIVER,
        help="call_path.py as the base revision's modules need it (default: this tree's)",
    )  # fmt: skip
    args = parser.parse_args()
    drivers = {"base": args.base_driver.resolve(), "head": DRIVER}
    if drivers["base"] != DRIVER:
        shown = subprocess.run(
            ["diff", str(DRIVER), str(drivers["base"])], capture_output=True, text=True,
            check=False,
        )  # fmt: skip
        print(f"base driver {drivers['base']}, against this tree's:\n{shown.stdout}")
    levels = [int(level) for level in args.levels.split(",")]
    with tempfile.TemporaryDirectory(prefix="trajcore-trees-") as folder:
        made: list[Path] = []
        try:
            trees = {}
            for name, rev in (("base", args.base), ("head", args.head)):
                trees[name] = worktree(rev, Path(folder))
                if trees[name] != REPO:
                    made.append(trees[name])
            print(f"base {args.base}, head {args.head}; load average "
                  f"{os.getloadavg()[0]:.2f} before; rounds of {args.seconds} s, "
                  f"{args.pairs} alternations of 3 rounds per row")  # fmt: skip
            print(f"{'row':<28}{'base mean':>11}{'median':>9}{'head mean':>11}{'median':>9}"
                  f"{'head/base':>11}")  # fmt: skip
            for path in ("pool", "direct"):
                for level in levels:
                    rates: dict[str, list[float]] = {"base": [], "head": []}
                    for _ in range(args.pairs):
                        for name in ("base", "head"):
                            rates[name] += measure(
                                trees[name], path, level, args.seconds, drivers[name]
                            )
                    base, head = (statistics.mean(rates[n]) for n in ("base", "head"))
                    ratio = head / base
                    verdict = "ok" if ratio >= BAR else f"BELOW {BAR:.2f}"
                    medians = [statistics.median(rates[n]) for n in ("base", "head")]
                    print(f"{path + f', {level} trajectories':<28}{base:>11,.0f}"
                          f"{medians[0]:>9,.0f}{head:>11,.0f}{medians[1]:>9,.0f}"
                          f"{ratio:>11.2f}  {verdict}")  # fmt: skip
            print(f"load average {os.getloadavg()[0]:.2f} after")
        finally:
            for tree in made:
                subprocess.run(
                    ["git", "-C", str(REPO), "worktree", "remove", "--force", str(tree)],
                    check=False,
                )


if __name__ == "__main__":
    main()
