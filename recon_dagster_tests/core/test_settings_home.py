"""Typed settings: every ``RECON_*`` variable is one typed attribute of
``recon_dagster.config.Settings``; no other module spells a ``RECON_*`` name, the docs' "read by"
column is found in the code, and a read happens when asked (the tests change the environment
between reads). Also item 6: ``media.s3_store`` does not import ``media.store`` back."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from recon_dagster import config
from recon_dagster.config import Settings, settings
from recon_dagster.config.docs import readers

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "recon_dagster"
HOME = PACKAGE / "config"
NAME = re.compile(r"RECON_[A-Z0-9_]*")


def _docstrings(tree: ast.AST) -> set[int]:
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                found.add(id(first.value))
    return found


def recon_literals(source: str) -> list[tuple[int, str]]:
    """Every ``RECON_*`` name inside a string constant (f-string parts included), docstrings aside."""
    tree = ast.parse(source)
    skip = _docstrings(tree)
    return [
        (node.lineno, name)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip
        for name in NAME.findall(node.value)
    ]


def test_no_module_outside_the_settings_home_spells_a_recon_name() -> None:
    stray = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path in sorted(PACKAGE.rglob("*.py"))
        if HOME not in path.parents
        for line, name in recon_literals(path.read_text())
    ]
    assert not stray, f"take the name from recon_dagster.config (Settings.<attribute>.name): {stray}"


def test_the_literal_check_sees_constants_and_f_string_parts_but_not_docstrings() -> None:
    code = (
        '"""RECON_DOC is prose."""\n'
        'A = "RECON_A"\n'
        'b = f"set RECON_B={x}"\n'
        "def f():\n"
        '    """RECON_F in a docstring."""\n'
        '    return {"RECON_C": 1}\n'
    )
    assert [name for _, name in recon_literals(code)] == ["RECON_A", "RECON_B", "RECON_C"]


def test_every_recon_setting_is_a_typed_attribute_named_after_it() -> None:
    attributes = config.attributes()
    assert {var.name for var in attributes.values()} == {n for n in config.SETTINGS if n.startswith("RECON_")}
    for attr, var in attributes.items():
        assert var.name == "RECON_" + attr.upper()
        assert getattr(Settings, attr) is var is config.SETTINGS[var.name]


def test_a_read_is_typed_and_happens_when_asked(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("RECON_MAX_ATTEMPTS", raising=False)
    assert settings().max_attempts == 18
    monkeypatch.setenv("RECON_MAX_ATTEMPTS", " 5 ")
    assert settings().max_attempts == 5 and isinstance(settings().max_attempts, int)
    monkeypatch.setenv("RECON_MAX_ATTEMPTS", "abc")
    with pytest.raises(
        ValueError, match=r"^RECON_MAX_ATTEMPTS must be a whole number from 1 to 1000, got 'abc'$"
    ):
        settings().max_attempts  # noqa: B018
    assert settings({"RECON_LEASE_S": "60"}).lease_s == 60.0
    assert settings({}).limit_overrides("kie") == {}
    assert settings({"RECON_LIMIT_KIE": "concurrency=4"}).limit_overrides("kie") == {"concurrency": 4}


def test_secrets_and_library_variables_are_only_named() -> None:
    for var in (Settings.alert_webhook_secret, Settings.s3_endpoint_url, Settings.crash_at):
        with pytest.raises(KeyError):
            settings({var.name: "sk-live"}).value(var)
        assert settings({var.name: "sk-live"}).is_set(var)


def test_every_setting_read_here_has_a_reader_found_in_the_code() -> None:
    found = readers()
    unread = [var.name for var in config.attributes().values() if not found[var.name]]
    assert not unread, f"declared but read by no module: {unread}"
    for modules in found.values():
        assert all((PACKAGE / module).is_file() for module in modules)


def test_the_readers_named_by_hand_exist() -> None:
    # The variables that are not RECON_* keep their readers in their declaration.
    for var in config.SETTINGS.values():
        for reader in filter(None, (r.strip() for r in var.readers.split(","))):
            assert (PACKAGE / reader).exists(), f"{var.name}: {reader} does not exist"


def test_the_reader_search_sees_value_reads_and_name_uses(tmp_path: Path) -> None:
    (tmp_path / "reads.py").write_text("now = settings(env)\nx = now.lease_s\ny = settings().max_attempts\n")
    (tmp_path / "names.py").write_text("n = Settings.alert_webhook_secret.name\nm = Settings.lease_s.name\n")
    (tmp_path / "limits.py").write_text("o = settings().limit_overrides(provider)\n")
    found = readers(tmp_path)
    assert found["RECON_LEASE_S"] == ["reads.py"]  # a name taken is not a value read
    assert found["RECON_MAX_ATTEMPTS"] == ["reads.py"]
    assert found["RECON_ALERT_WEBHOOK_SECRET"] == ["names.py"]  # a secret is only ever named
    assert found["RECON_LIMIT_KIE"] == found["RECON_LIMIT_ANTHROPIC"] == ["limits.py"]


def test_the_s3_store_does_not_import_the_store_that_imports_it() -> None:
    tree = ast.parse((PACKAGE / "media" / "s3_store.py").read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    imported |= {
        alias.name for node in ast.walk(tree) if isinstance(node, ast.Import) for alias in node.names
    }
    assert "recon_dagster.media.store" not in imported
