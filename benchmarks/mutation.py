"""Mutation score of the money and state modules (mutmut), per module, in bounded time.

mutmut (configured in ``pyproject.toml`` under ``[tool.mutmut]``) rewrites each function of
``db/credits.py``, ``db/jobs.py`` (with ``db/transitions.py``), ``reconcile/decide.py`` and
``reconcile/finalize.py`` into many small variants (a ``>=`` turned into ``>``, a string or number
changed, an argument dropped...) and runs, for each variant, the tests that exercised that function. A variant the
tests do not notice (it "survives") is behaviour no test pins.

The run happens in a scratch copy of the project (``--workdir``, default
``.recon/mutation/<label>``, git-ignored) so the repository's own files are never touched and
two configurations (e.g. with and without some test files) can be measured side by side. The
copy's test selection is the configured one, minus ``--without`` files.

Bounded: ``--sample N`` takes a seeded random sample of N mutants per module (the output says
whether a module ran in full or as a sample, with size and seed), and ``--max-minutes`` stops
mutmut when the time is up; mutants it had not reached are counted as "not checked" and left
out of the score. ``--resume`` re-runs, in the same workdir, only the mutants not killed so far
(after tests were added to the files already selected). Prints, per module, killed / survived /
no tests / timeout / not checked and the score (killed + timeout over checked mutants), then
every surviving mutant with its diff.

Tests use ``RECON_DATABASE_URL`` (or the embedded server when unset), as the test suite does.

    RECON_DATABASE_URL=postgresql://root@127.0.0.1:5432/postgres \
      .venv/bin/python benchmarks/mutation.py [--sample 60] [--seed 12] [--max-minutes 30]
      [--modules credits,decide] [--without recon_dagster_tests/reconcile/test_decide.py] [--label before]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import time
import tomllib
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MODULES = {
    "credits": "recon_dagster/db/credits.py",
    "jobs": "recon_dagster/db/jobs.py",
    "transitions": "recon_dagster/db/transitions.py",
    "decide": "recon_dagster/reconcile/decide.py",
    "finalize": "recon_dagster/reconcile/finalize.py",
    "completion": "recon_dagster/reconcile/completion.py",
}
COPIED = ("recon_dagster", "recon_dagster_tests", "migrations")
# mutmut's exit-code classes (mutmut.stats.status_by_exit_code), folded into what the score needs.
KILLED = {"killed", "timeout", "caught by type check", "segfault"}
NOT_KILLED = {"survived", "no tests", "suspicious"}


@dataclass
class ModuleResult:
    path: str
    generated: int
    selected: list[str]
    sampled: bool
    status: dict[str, str] = field(default_factory=dict)

    @property
    def counts(self) -> Counter[str]:
        return Counter(self.status.get(name, "not checked") for name in self.selected)

    @property
    def checked(self) -> int:
        c = self.counts
        return sum(n for s, n in c.items() if s in KILLED | NOT_KILLED)

    @property
    def killed(self) -> int:
        return sum(n for s, n in self.counts.items() if s in KILLED)

    @property
    def score(self) -> float | None:
        return None if not self.checked else 100.0 * self.killed / self.checked


def mutant_names(path: str) -> list[str]:
    """Every mutant mutmut generates for one source file (same generator mutmut run uses)."""
    from mutmut.mutation.file_mutation import mutate_file_contents
    from mutmut.utils.format_utils import get_mutant_name

    mutated = mutate_file_contents(path, (ROOT / path).read_text())
    return sorted(get_mutant_name(Path(path), name) for name in mutated.mutant_names)


def test_selection() -> list[str]:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["mutmut"]
    return list(config["pytest_add_cli_args_test_selection"])


def prepare_workdir(workdir: Path, selection: list[str], without: set[str]) -> None:
    """A fresh scratch copy of the project whose mutmut test selection is ``selection``."""
    if workdir.exists():
        shutil.rmtree(workdir)
    workdir.mkdir(parents=True)
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in COPIED:
        shutil.copytree(ROOT / name, workdir / name, ignore=ignore)
    for test_file in without:
        (workdir / test_file).unlink(missing_ok=True)
    listed = ",\n".join(f'    "{t}"' for t in selection)
    pyproject = re.sub(
        r"pytest_add_cli_args_test_selection = \[.*?\]",
        lambda _: f"pytest_add_cli_args_test_selection = [\n{listed},\n]",
        (ROOT / "pyproject.toml").read_text(),
        count=1,
        flags=re.S,
    )
    # The scratch copy is not a git checkout of its own: no change detection against the repo.
    pyproject = pyproject.replace("[tool.mutmut]\n", "[tool.mutmut]\nuse_git_change_detection = false\n", 1)
    (workdir / "pyproject.toml").write_text(pyproject)


def refresh_tests(workdir: Path, without: set[str]) -> None:
    """Copy the current test files into an existing workdir (mutmut copies them on into mutants/)."""
    target = workdir / "recon_dagster_tests"
    shutil.copytree(
        ROOT / "recon_dagster_tests", target, dirs_exist_ok=True, ignore=shutil.ignore_patterns("__pycache__")
    )
    for test_file in without:
        (workdir / test_file).unlink(missing_ok=True)


def run_mutmut(
    workdir: Path, names: list[str], max_children: int, max_minutes: float, log: Path
) -> int | None:
    """``mutmut run NAMES`` in the workdir; interrupted (SIGINT, then SIGKILL) when time is up."""
    mutmut = Path(sys.executable).with_name("mutmut")
    cmd = [str(mutmut), "run", "--max-children", str(max_children), *names]
    with log.open("w") as out:
        proc = subprocess.Popen(
            cmd, cwd=workdir, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            return proc.wait(timeout=max_minutes * 60)
        except subprocess.TimeoutExpired:
            print(f"time is up after {max_minutes} min: stopping mutmut (unreached mutants: not checked)")
            # SIGINT to mutmut's main process only: it stops its workers and keeps finished results.
            proc.send_signal(signal.SIGINT)
            try:
                proc.wait(timeout=90)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            return None


def load_status(workdir: Path, path: str) -> dict[str, str]:
    from mutmut.stats import status_by_exit_code

    meta = workdir / "mutants" / (path + ".meta")
    if not meta.exists():
        return {}
    codes = json.loads(meta.read_text())["exit_code_by_key"]
    return {name: status_by_exit_code[code] for name, code in codes.items()}


def diff_lines(workdir: Path, name: str) -> list[str]:
    """The changed lines of one mutant, from ``mutmut show NAME``."""
    mutmut = Path(sys.executable).with_name("mutmut")
    shown = subprocess.run(
        [str(mutmut), "show", name], cwd=workdir, capture_output=True, text=True, check=False
    ).stdout
    return [line for line in shown.splitlines() if line[:1] in "+-" and not line.startswith(("+++", "---"))]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--modules", default=",".join(MODULES), help="comma-separated of: " + ", ".join(MODULES))
    ap.add_argument("--sample", type=int, default=0, help="mutants per module (0: all of them)")
    ap.add_argument("--seed", type=int, default=12)
    ap.add_argument("--max-minutes", type=float, default=30.0)
    ap.add_argument("--max-children", type=int, default=2)
    ap.add_argument("--without", action="append", default=[], help="test file left out (repeatable)")
    ap.add_argument("--label", default="default", help="names the scratch workdir")
    ap.add_argument("--workdir", type=Path, default=None)
    ap.add_argument(
        "--resume",
        action="store_true",
        help="keep the workdir's results, refresh its test files, re-run only the mutants not killed",
    )
    args = ap.parse_args()
    if not Path(sys.executable).with_name("mutmut").exists():
        print(
            "mutation.py: mutmut is not installed in this environment; "
            "install the extra with: .venv/bin/pip install -e '.[dev,mutation]'",
            file=sys.stderr,
        )
        return 1

    modules = [m.strip() for m in args.modules.split(",") if m.strip()]
    unknown = [m for m in modules if m not in MODULES]
    if unknown:
        ap.error(f"unknown module(s) {unknown}; choose from {list(MODULES)}")
    without = {str(Path(w)) for w in args.without}
    selection = [t for t in test_selection() if t not in without]
    workdir = args.workdir or ROOT / ".recon" / "mutation" / args.label

    results: list[ModuleResult] = []
    for key in modules:
        path = MODULES[key]
        names = mutant_names(path)
        sampled = 0 < args.sample < len(names)
        chosen = sorted(random.Random(f"{args.seed}:{path}").sample(names, args.sample)) if sampled else names
        results.append(ModuleResult(path, len(names), chosen, sampled))

    from importlib.metadata import version

    print(f"mutmut {version('mutmut')}; workdir {workdir}")
    print("tests: " + " ".join(selection))
    if without:
        print("left out: " + " ".join(sorted(without)))
    for r in results:
        what = f"sample of {len(r.selected)} (seed {args.seed})" if r.sampled else "full set"
        print(f"  {r.path}: {r.generated} mutants generated; running the {what}")
    sys.stdout.flush()

    names = [n for r in results for n in r.selected]
    if args.resume and (workdir / "mutants").is_dir():
        # Same sources and test selection (a changed selection makes mutmut discard every
        # result); new tests in the selected files are picked up by mutmut's incremental stats.
        refresh_tests(workdir, without)
        done = {n for r in results for n, s in load_status(workdir, r.path).items() if s in KILLED}
        names = [n for n in names if n not in done]
        print(f"resuming {workdir}: {len(done)} mutants already killed; re-running the other {len(names)}")
    else:
        prepare_workdir(workdir, selection, without)
    log = workdir / "mutmut.log"
    started = time.monotonic()
    code = run_mutmut(workdir, names, args.max_children, args.max_minutes, log) if names else 0
    elapsed = time.monotonic() - started
    print(f"mutmut finished in {elapsed / 60:.1f} min (exit {code}); its output: {log}")
    if code not in (0, None):
        print("".join(log.read_text().splitlines(keepends=True)[-30:]))

    for r in results:
        r.status = load_status(workdir, r.path)

    header = f"{'module':38} {'set':>14} {'killed':>7} {'timeout':>8} {'survived':>9} {'no tests':>9} {'not chkd':>9} {'score':>7}"
    print()
    print(header)
    total_killed = total_checked = 0
    for r in results:
        c = r.counts
        what = f"sample {len(r.selected)}/{r.generated}" if r.sampled else f"full {r.generated}"
        score = "-" if r.score is None else f"{r.score:.1f}%"
        print(
            f"{r.path:38} {what:>14} {c['killed']:>7} {c['timeout']:>8} {c['survived']:>9} "
            f"{c['no tests']:>9} {c['not checked']:>9} {score:>7}"
        )
        total_killed += r.killed
        total_checked += r.checked
    if total_checked:
        print(
            f"{'all':38} {'':>14} {'':>7} {'':>8} {'':>9} {'':>9} {'':>9} {100.0 * total_killed / total_checked:.1f}%"
        )

    survivors = [(n, r.status[n]) for r in results for n in r.selected if r.status.get(n) in NOT_KILLED]
    print()
    print(f"surviving mutants: {len(survivors)}")
    for name, status in survivors:
        print(f"  {name} [{status}]")
        for line in diff_lines(workdir, name):
            print(f"      {line.strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
