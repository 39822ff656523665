"""One home for configuration: every variable the code names is declared in
``recon_dagster.config``, read only through it, and ``docs/configuration.md`` is generated from
the declarations."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

from recon_dagster import config

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "recon_dagster"
DOC = ROOT / "docs" / "configuration.md"
# Allowed to read the environment themselves: the home of configuration, the sandbox's own
# settings, and the fault injector (one global lookup on a hot path, declared all the same).
OWN_READERS = {PACKAGE / "config" / "__init__.py", PACKAGE / "core" / "crashpoints.py"}

OWN_TREES = (PACKAGE / "sandbox",)

NAME = re.compile(r"RECON_[A-Z0-9_]*")


def _sources() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_the_committed_configuration_page_is_the_generated_one() -> None:
    generated = subprocess.run(
        [sys.executable, "-m", "recon_dagster.config", "--markdown"],
        capture_output=True,
        text=True,
        check=True,
        cwd=ROOT,
    ).stdout
    assert generated == config.markdown()
    assert DOC.read_text() == generated, (
        "docs/configuration.md is stale: python -m recon_dagster.config --markdown > docs/configuration.md"
    )


def test_every_recon_name_in_the_code_is_declared() -> None:
    declared = set(config.SETTINGS)
    missing: dict[str, set[str]] = {}
    for path in _sources():
        for name in NAME.findall(path.read_text()):
            # A prefix (RECON_LIMIT_{provider}, RECON_CRASH_*) must be the start of a declared name.
            known = any(d.startswith(name) for d in declared) if name.endswith("_") else name in declared
            if not known:
                missing.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    assert not missing, f"undeclared in recon_dagster/config.py: {missing}"


def _module_constants() -> dict[str, str]:
    """Every module-level ``NAME = "RECON_..."`` of the package, to resolve reads by constant."""
    constants: dict[str, str] = {}
    for path in _sources():
        for node in ast.parse(path.read_text()).body:
            value = (
                node.value.value
                if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                else None
            )
            if isinstance(node, ast.Assign) and isinstance(value, str) and value.startswith("RECON_"):
                constants.update({t.id: value for t in node.targets if isinstance(t, ast.Name)})
    return constants


def _environ_reads(tree: ast.AST, constants: dict[str, str]) -> list[tuple[int, str]]:
    """``os.environ.get(X)``, ``os.environ[X]`` (read), ``os.getenv(X)`` with X a RECON_ name."""

    def name_of(arg: ast.expr) -> str | None:
        if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
            return arg.value
        if isinstance(arg, ast.JoinedStr) and arg.values and isinstance(arg.values[0], ast.Constant):
            return str(arg.values[0].value)
        return constants.get(arg.id) if isinstance(arg, ast.Name) else None

    reads = []
    for node in ast.walk(tree):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args:
            source = ast.unparse(node.func.value)
            if (node.func.attr == "get" and source.endswith("environ")) or ast.unparse(
                node.func
            ) == "os.getenv":
                target = node.args[0]
        elif (
            isinstance(node, ast.Subscript)
            and isinstance(node.ctx, ast.Load)
            and ast.unparse(node.value).endswith("environ")
        ):
            target = node.slice
        name = name_of(target) if target is not None else None
        if name and name.startswith("RECON_"):
            reads.append((node.lineno, name))
    return reads


def test_no_module_reads_a_recon_variable_but_through_config() -> None:
    constants = _module_constants()
    stray = []
    for path in _sources():
        if path in OWN_READERS or any(tree in path.parents for tree in OWN_TREES):
            continue
        for line, name in _environ_reads(ast.parse(path.read_text()), constants):
            stray.append(f"{path.relative_to(ROOT)}:{line} reads {name}")
    assert not stray, stray


def test_the_stray_read_check_sees_reads_by_literal_and_by_constant() -> None:
    # The check above must fail on the reads it exists to forbid.
    code = (
        'X_ENV = "RECON_X"\n'
        'a = os.environ.get("RECON_A", "")\n'
        "b = os.environ.get(X_ENV)\n"
        'c = os.environ["RECON_C"]\n'
        'd = os.getenv("RECON_D")\n'
        'os.environ["RECON_E"] = "written, not read"\n'
    )
    reads = _environ_reads(ast.parse(code), {"X_ENV": "RECON_X"})
    assert [name for _, name in reads] == ["RECON_A", "RECON_X", "RECON_C", "RECON_D"]


def test_a_bad_value_is_one_line_naming_its_variable_and_unset_is_the_default() -> None:
    for setting in config.SETTINGS.values():
        if setting.secret or setting.parse is None:
            continue
        assert config.get(setting.name, {}) == setting.default
        try:
            config.get(setting.name, {setting.name: "\x00bad\x00"})
        except ValueError as exc:
            assert str(exc).startswith(setting.name) and "\n" not in str(exc), exc


def test_secrets_are_never_read_through_config() -> None:
    secrets = [s for s in config.SETTINGS.values() if s.secret]
    assert {s.name for s in secrets} >= {
        "KIE_API_KEY",
        "REPLICATE_API_TOKEN",
        "ELEVENLABS_API_KEY",
        "ANTHROPIC_API_KEY",
    }
    for s in secrets:
        with pytest.raises(KeyError):
            config.get(s.name, {s.name: "sk-live"})
    assert "sk-live" not in config.markdown()


def test_the_defaults_the_domain_keeps_are_the_declared_ones() -> None:
    # The domain reads no settings, so its own defaults must agree with the declarations.
    from recon_dagster.defs.resources import ReconcileSettingsResource
    from recon_dagster.defs.settings_check import breaker_policy, shadow_modes
    from recon_dagster.providers.limit_config import DEFAULT_LIMITS, AccountLimits, parse_account_limits
    from recon_dagster.reconcile.decide import BreakerPolicy
    from recon_dagster.reconcile.reconciler import ReconcileSettings
    from recon_dagster.reconcile.shadow import Modes

    assert ReconcileSettingsResource().settings() == ReconcileSettings()
    assert breaker_policy({}) == BreakerPolicy()
    assert shadow_modes({}) == Modes()
    for provider, limits in DEFAULT_LIMITS.items():
        name = f"RECON_LIMIT_{provider.upper()}"
        shown = config.SETTINGS[name].shown_default or ""
        assert parse_account_limits(name, shown.strip("`"), AccountLimits(provider)) == limits, name
