"""What a migration file says, read with PostgreSQL's own parser (pglast, i.e. libpg_query).

Each statement with the line it starts on, the tables it locks and in which mode, and the few facts
the migrator acts on: a ``SET`` of a session setting, the columns an ``ALTER TABLE ... ADD COLUMN
IF NOT EXISTS`` adds, the index a ``CREATE INDEX`` builds (and whether ``CONCURRENTLY``). The
parser is the server's grammar, so ``E'it\\'s'`` strings, nested ``/* /* */ */`` comments and
dollar-quoted bodies split exactly as PostgreSQL splits them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from pglast import ast as _ast
from pglast import enums, parser
from pglast.parser import ParseError

# pglast declares every AST field Optional; the code below checks node types itself.
ast: Any = _ast

# The host app's tables (migration 001 creates them only where none exists). Every other table a
# migration names is recon_dagster's own.
APP_TABLES = frozenset(
    {"user_credits", "workflow_executions", "jobs", "usage_logs", "assets", "credit_anomalies", "characters"}
)

ACCESS_EXCLUSIVE = "ACCESS EXCLUSIVE"
SHARE = "SHARE"
SHARE_ROW_EXCLUSIVE = "SHARE ROW EXCLUSIVE"
SHARE_UPDATE_EXCLUSIVE = "SHARE UPDATE EXCLUSIVE"
ROW_EXCLUSIVE = "ROW EXCLUSIVE"
ACCESS_SHARE = "ACCESS SHARE"

# Lock modes that make the app's INSERT/UPDATE/DELETE (ROW EXCLUSIVE) wait, held or queued for.
BLOCKS_APP_WRITES = frozenset({ACCESS_EXCLUSIVE, SHARE, SHARE_ROW_EXCLUSIVE, "EXCLUSIVE"})


class MigrationSqlError(ValueError):
    """A migration file PostgreSQL's grammar cannot parse; the message names the line."""


@dataclass(frozen=True)
class Lock:
    table: str
    mode: str
    new: bool = False  # a table this very statement creates: nobody else can be using it

    @property
    def app_table(self) -> bool:
        return self.table in APP_TABLES and not self.new

    @property
    def blocks_app_writes(self) -> bool:
        return self.app_table and self.mode in BLOCKS_APP_WRITES


@dataclass(frozen=True)
class Statement:
    line: int
    text: str
    node: Any = field(repr=False, compare=False)  # a pglast.ast node (its fields are all Optional)
    locks: tuple[Lock, ...] = ()

    @property
    def first_line(self) -> str:
        return self.text.splitlines()[0][:120]

    @property
    def app_locks(self) -> tuple[Lock, ...]:
        return tuple(lock for lock in self.locks if lock.app_table)

    @property
    def setting(self) -> tuple[str, str | None] | None:
        """``SET name = value`` as (name, value); ``RESET name`` as (name, None)."""
        node = self.node
        if not isinstance(node, ast.VariableSetStmt) or node.name is None:
            return None
        if node.kind == enums.VariableSetKind.VAR_RESET:
            return node.name, None
        value = _const_text(node.args[0]) if node.args else None
        return node.name, value

    @property
    def concurrent(self) -> bool:
        return bool(getattr(self.node, "concurrent", False))

    @property
    def index(self) -> tuple[str, str] | None:
        """(index, table) of a ``CREATE INDEX`` that names its index."""
        node = self.node
        if isinstance(node, ast.IndexStmt) and node.idxname:
            return node.idxname, node.relation.relname
        return None

    @property
    def if_not_exists(self) -> bool:
        return bool(getattr(self.node, "if_not_exists", False))

    @property
    def added_columns(self) -> tuple[str, tuple[str, ...]] | None:
        """(table, columns) of an ``ALTER TABLE`` made only of ``ADD COLUMN IF NOT EXISTS``."""
        node = self.node
        if not isinstance(node, ast.AlterTableStmt) or not node.cmds:
            return None
        columns = []
        for cmd in node.cmds:
            if cmd.subtype != enums.AlterTableType.AT_AddColumn or not cmd.missing_ok:
                return None
            columns.append(cmd.def_.colname)
        return node.relation.relname, tuple(columns)

    @property
    def dropped_constraints(self) -> tuple[str, tuple[str, ...]] | None:
        """(table, constraints) of an ``ALTER TABLE`` made only of ``DROP CONSTRAINT IF EXISTS``."""
        node = self.node
        if not isinstance(node, ast.AlterTableStmt) or not node.cmds:
            return None
        names = []
        for cmd in node.cmds:
            if cmd.subtype != enums.AlterTableType.AT_DropConstraint or not cmd.missing_ok:
                return None
            names.append(cmd.name)
        return node.relation.relname, tuple(names)

    @property
    def creates_table(self) -> str | None:
        node = self.node
        return node.relation.relname if isinstance(node, ast.CreateStmt) else None


def _const_text(node: Any) -> str | None:
    value = getattr(node, "val", None)
    for attr in ("sval", "ival", "fval"):
        if value is not None and getattr(value, attr, None) is not None:
            return str(getattr(value, attr))
    return None


def _foreign_tables(elements: Any) -> list[str]:
    """The tables a CREATE TABLE's column or table constraints reference (REFERENCES t)."""
    found = []
    for element in elements or ():
        constraints = element.constraints if isinstance(element, ast.ColumnDef) else (element,)
        for constraint in constraints or ():
            if (
                isinstance(constraint, ast.Constraint)
                and constraint.contype == enums.ConstrType.CONSTR_FOREIGN
            ):
                found.append(constraint.pktable.relname)
    return found


# DDL inside a DO block's body, read from its text (plpgsql is not parsed): the tables it alters or
# indexes. Enough for the plan to name the app tables a block touches.
_DO_ALTER = re.compile(r"\bALTER\s+TABLE\s+(?:IF\s+EXISTS\s+)?(?:ONLY\s+)?([\w.]+)", re.I)
_DO_INDEX = re.compile(r"\bCREATE\s+(?:UNIQUE\s+)?INDEX\b[^;]*?\bON\s+(?:ONLY\s+)?([\w.]+)", re.I)


def _do_body(node: Any) -> str:
    for arg in node.args or ():
        if arg.defname == "as":
            return str(arg.arg.sval)
    return ""


def _locks(node: Any) -> tuple[Lock, ...]:
    if isinstance(node, ast.CreateStmt):
        table = node.relation.relname
        refs = [Lock(t, SHARE_ROW_EXCLUSIVE) for t in _foreign_tables(node.tableElts) if t != table]
        return (Lock(table, ACCESS_EXCLUSIVE, new=True), *refs)
    if isinstance(node, ast.IndexStmt):
        return (Lock(node.relation.relname, SHARE_UPDATE_EXCLUSIVE if node.concurrent else SHARE),)
    if isinstance(node, ast.AlterTableStmt):
        validate_only = all(c.subtype == enums.AlterTableType.AT_ValidateConstraint for c in node.cmds or ())
        mode = SHARE_UPDATE_EXCLUSIVE if validate_only else ACCESS_EXCLUSIVE
        refs = [
            Lock(c.def_.pktable.relname, SHARE_ROW_EXCLUSIVE)
            for c in node.cmds or ()
            if isinstance(c.def_, ast.Constraint) and c.def_.contype == enums.ConstrType.CONSTR_FOREIGN
        ]
        return (Lock(node.relation.relname, mode), *refs)
    if isinstance(node, ast.DropStmt) and node.removeType == enums.ObjectType.OBJECT_INDEX:
        # The index's table is not in the statement; the plan names the index instead.
        names = [".".join(p.sval for p in obj) for obj in node.objects or ()]
        return tuple(
            Lock(f"index {n}", SHARE_UPDATE_EXCLUSIVE if node.concurrent else ACCESS_EXCLUSIVE) for n in names
        )
    if isinstance(node, ast.DoStmt):
        body = _do_body(node)
        tables = [Lock(m.split(".")[-1], ACCESS_EXCLUSIVE) for m in _DO_ALTER.findall(body)]
        tables += [Lock(m.split(".")[-1], SHARE) for m in _DO_INDEX.findall(body)]
        return tuple(dict.fromkeys(tables))
    if isinstance(node, ast.InsertStmt | ast.UpdateStmt | ast.DeleteStmt):
        return (Lock(node.relation.relname, ROW_EXCLUSIVE),)
    return ()


def split(sql: str) -> list[Statement]:
    """The statements of ``sql`` in order, each with its line, text and locks; comment-only parts
    are dropped. A file the grammar refuses raises ``MigrationSqlError`` naming the line."""
    try:
        raw = parser.parse_sql(sql)
    except ParseError as exc:
        # args: (message, 1-based character position of the error)
        where = exc.args[1] if len(exc.args) > 1 and isinstance(exc.args[1], int) else 1
        line = sql.count("\n", 0, max(where - 1, 0)) + 1
        raise MigrationSqlError(f"line {line}: {exc.args[0]}") from None
    out = []
    for item in raw:
        start = item.stmt_location or 0
        end = start + item.stmt_len if item.stmt_len else len(sql)
        text = sql[start:end].strip().rstrip(";").rstrip()
        out.append(Statement(sql.count("\n", 0, start) + 1, text, item.stmt, _locks(item.stmt)))
    return out


__all__ = [
    "ACCESS_EXCLUSIVE",
    "APP_TABLES",
    "SHARE_UPDATE_EXCLUSIVE",
    "Lock",
    "MigrationSqlError",
    "Statement",
    "split",
]
