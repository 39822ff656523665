"""Read PostgreSQL's EXPLAIN (FORMAT JSON) plans: every node, and the index a node scans."""

from __future__ import annotations

from typing import Any


def plan_nodes(plan: dict[str, Any]) -> list[dict[str, Any]]:
    found = [plan]
    for child in plan.get("Plans", []):
        found.extend(plan_nodes(child))
    return found


def index_of(node: dict[str, Any]) -> str | None:
    """The index a node on jobs reads through: its own (index scans) or its bitmap children's."""
    if node["Node Type"] in ("Index Scan", "Index Only Scan"):
        return node["Index Name"]
    if node["Node Type"] == "Bitmap Heap Scan":
        names = {n.get("Index Name") for n in plan_nodes(node) if n["Node Type"] == "Bitmap Index Scan"}
        return names.pop() if len(names) == 1 else f"several: {sorted(map(str, names))}"
    return None  # a Seq Scan, or anything else that is not the index
