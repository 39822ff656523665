"""Every benchmark script still imports: they run outside the test suite, so a renamed module
(``reconcile.dispatch`` -> ``reconcile.batches`` broke ``benchmarks/statements.py`` unnoticed)
would otherwise surface only when someone next measures."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
# Not benchmarks of their own: they must import, they have no main(). ``harness.py`` is what the
# benchmarks share; ``spend_location.py`` is the code location ``spend_beside_backlog.py`` serves;
# ``year_world.py`` is ``year.py``'s sampled days (the real reconciler, GraphQL pages);
# ``year_runs.py`` clones a sampled day's Dagster runs into the bulk days.
SHARED_MODULES = {"harness.py", "spend_location.py", "year_runs.py", "year_world.py"}


@pytest.mark.parametrize("script", sorted(p.name for p in BENCHMARKS.glob("*.py")))
def test_benchmark_script_imports(script: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))  # the scripts import each other by name
    spec = importlib.util.spec_from_file_location(f"_benchmark_{script[:-3]}", BENCHMARKS / script)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    if script in SHARED_MODULES:
        return
    assert callable(getattr(module, "main", None)), f"benchmarks/{script} has no main()"
