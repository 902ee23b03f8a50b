"""The documents stay within the lengths issue 42 sets (words as `wc -w` counts them):
each grew past its limit once, a paragraph at a time."""

from __future__ import annotations

from pathlib import Path

import pytest

DOCS = Path(__file__).resolve().parent.parent / "docs"


@pytest.mark.parametrize(
    ("name", "limit"), [("design.md", 3000), ("exo.md", 3000), ("testing.md", 1500)]
)
def test_a_document_stays_within_its_words(name: str, limit: int) -> None:
    words = len((DOCS / name).read_text().split())
    assert words <= limit, f"docs/{name}: {words} words, past {limit}"
