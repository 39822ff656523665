"""Reasons shown to a person: one line, cut at a word boundary when too long (pure)."""

from __future__ import annotations


def one_line(text: str | None) -> str:
    """``text`` with every run of whitespace (line breaks included) made one space."""
    return " ".join((text or "").split())


def cut_at_word(text: str, limit: int) -> str:
    """``text`` in at most ``limit`` characters: cut after the last whole word that fits, with an
    ellipsis, never in the middle of a word (unless one word alone is longer than half of it)."""
    if len(text) <= limit:
        return text
    head = text[: max(1, limit - 1)]
    space = head.rfind(" ")
    if space > limit // 2:
        head = head[:space]
    return head.rstrip(" ,;:(") + "…"


def short_reason(text: str | None, limit: int = 300) -> str:
    """One line of ``text``, cut at a word boundary to ``limit`` characters ("-" when empty)."""
    flat = one_line(text)
    return cut_at_word(flat, limit) if flat else "-"
