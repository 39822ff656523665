"""The structure checks (issue 49): no import circles, files under ~600 lines.

import-linter (``lint-imports`` in CI, contracts in pyproject.toml) keeps each folder's direction
of use; these tests keep the whole package and the benchmarks free of circles (which a layers
contract only sees inside the folders it names), and every file small enough to read.
"""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[2]
MAX_LINES = 600
# Files over the limit when the check came in, each at most its size then: they may only shrink
# (split one when it must grow, then drop its line here).
OVER_THE_LIMIT = {
    "recon_dagster/providers/http.py": 622,
}


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as exc:
        return list(exc.args[1])
    return None


def test_the_package_has_no_import_circle() -> None:
    # Imports under TYPE_CHECKING are types only (as for import-linter: exclude_type_checking_imports).
    graph = grimp.build_graph("recon_dagster", exclude_type_checking_imports=True)
    edges = {module: graph.find_modules_directly_imported_by(module) for module in graph.modules}
    # A package's __init__ re-exporting its own modules is not a circle of two rooms: an edge from a
    # package to one of its own modules is left out.
    acyclic = {m: {i for i in imported if not i.startswith(m + ".")} for m, imported in edges.items()}
    assert _cycle(acyclic) is None, f"import circle: {' -> '.join(_cycle(acyclic) or [])}"


def _sibling_imports(path: Path, siblings: set[str]) -> set[str]:
    """The sibling scripts ``path`` imports (``from backlog import`` or ``benchmarks.backlog``),
    at any depth: a benchmark imports its variants inside ``main``."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        for name in names:
            name = name.removeprefix("benchmarks.")
            if name in siblings:
                found.add(name)
    return found


def test_the_benchmarks_have_no_import_circle() -> None:
    scripts = {p.stem: p for p in (ROOT / "benchmarks").glob("*.py")}
    graph = {name: _sibling_imports(path, set(scripts)) - {name} for name, path in scripts.items()}
    assert _cycle(graph) is None, f"import circle in benchmarks/: {' -> '.join(_cycle(graph) or [])}"
    # What the daemon benchmarks share lives in harness.py, which imports none of them.
    assert graph["harness"] == set()


def test_the_cycle_finder_finds_a_circle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) is not None
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": set()}) is None


def test_every_file_stays_under_the_size_limit() -> None:
    over = []
    for top in ("recon_dagster", "recon_dagster_tests", "benchmarks"):
        for path in sorted((ROOT / top).rglob("*.py")):
            relative = path.relative_to(ROOT).as_posix()
            lines = len(path.read_text().splitlines())
            if lines > OVER_THE_LIMIT.get(relative, MAX_LINES):
                over.append(f"{relative}: {lines} lines (limit {OVER_THE_LIMIT.get(relative, MAX_LINES)})")
    assert not over, f"split where a file holds two rooms: {over}"


def test_the_files_over_the_limit_are_still_over_it() -> None:
    # A file that came under the limit leaves OVER_THE_LIMIT, so it cannot grow back unnoticed.
    for relative in OVER_THE_LIMIT:
        assert len((ROOT / relative).read_text().splitlines()) > MAX_LINES, f"drop {relative} from the list"
