"""``docs/configuration.md``, generated from the declarations (``python -m recon_dagster.config
--markdown``; a test keeps the committed page equal to it).

Its "read by" column is found in the code, not kept by hand: for each ``RECON_*`` setting, the
modules that read its value (``settings(...).x``, or a name bound to ``settings(...)``; every
``RECON_LIMIT_*`` through ``.limit_overrides(...)``), or, for a variable that is only named (a
secret, one a library or the fault injector reads), the modules that take its name
(``Settings.x``). The few variables that are not ``RECON_*`` keep their readers in their
declaration.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

from recon_dagster.config import Var, attributes, declared, limit_name
from recon_dagster.config.parse import shown_number

PACKAGE = Path(__file__).resolve().parents[1]


def _uses(tree: ast.AST) -> tuple[set[str], set[str]]:
    """The attributes of ``Settings`` a module reads the value of, and those it takes the name of."""
    bound = {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, ast.Assign) and _is_settings_call(node.value)
        for target in node.targets
        if isinstance(target, ast.Name)
    }
    values: set[str] = set()
    names: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Attribute):
            continue
        owner = node.value
        if _is_settings_call(owner) or (isinstance(owner, ast.Name) and owner.id in bound):
            values.add(node.attr)
        elif isinstance(owner, ast.Name) and owner.id == "Settings":
            names.add(node.attr)
    return values, names


def _is_settings_call(node: ast.expr) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "settings"


def readers(package: Path = PACKAGE) -> dict[str, list[str]]:
    """Variable name -> the modules (paths below the package) that read it, as found in the code."""
    declared()  # the providers' settings too
    declarations = attributes()
    by_name = {var.name: attr for attr, var in declarations.items()}
    limits = {name for name in by_name if name.startswith(limit_name(""))}
    found: dict[str, set[str]] = {name: set() for name in by_name}
    home = Path(__file__).resolve().parent
    for path in sorted(package.rglob("*.py")):
        if home in path.parents or path.parent == home:
            continue
        module = path.relative_to(package).as_posix()
        values, names = _uses(ast.parse(path.read_text()))
        for name, attr in by_name.items():
            var: Var[object] = declarations[attr]
            used = names if var.parse is None else values
            if attr in used or (name in limits and "limit_overrides" in values):
                found[name].add(module)
    return {name: sorted(modules) for name, modules in found.items()}


def _shown(setting: Var[object]) -> str:
    if setting.shown_default is not None:
        return setting.shown_default
    if setting.secret or setting.default is None:
        return "—"
    if isinstance(setting.default, bool) or not isinstance(setting.default, int | float):
        return str(setting.default)
    return shown_number(setting.default)


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def markdown() -> str:
    """``docs/configuration.md``: every declared setting, grouped, in declaration order."""
    lines = [
        "# Configuration",
        "",
        "<!-- Generated from recon_dagster/config/: python -m recon_dagster.config --markdown -->",
        "",
        "Everything is configured through environment variables; none is needed for the demo or the",
        "tests. Every setting is declared once, in `recon_dagster/config/groups/` (by group), and checked",
        "when the definitions load and when the CLI starts: a bad value is one line naming its variable (the",
        "CLI exits 1). Secrets are read only through `dg.EnvVar`, so their values never appear in run",
        'config, tags, logs or the UI. The "read by" column is found in the code.',
    ]
    found = readers()
    groups: dict[str, list[Var[object]]] = {}
    for setting in declared():
        groups.setdefault(setting.group, []).append(setting)
    for group, settings in groups.items():
        lines += ["", f"## {group[0].upper()}{group[1:]}", ""]
        lines += [
            "| variable | type | default | bounds | meaning | read by |",
            "| --- | --- | --- | --- | --- | --- |",
        ]
        for s in settings:
            kind = f"{s.type} (dg.EnvVar, never printed)" if s.secret else s.type
            read_by = s.readers or ", ".join(found.get(s.name, ())) or "—"
            cells = (f"`{s.name}`", kind, _shown(s), s.bounds or "—", s.doc, read_by)
            lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    if argv != ["--markdown"]:
        print("usage: python -m recon_dagster.config --markdown", file=sys.stderr)
        return 2
    sys.stdout.write(markdown())
    return 0
