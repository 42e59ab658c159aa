"""Citations a reader can follow.

The protocol documents runwire is built from are not in the repository, so
code, tests and docs cite them by title and section ("Koder agent stream §4
R1", "Loom streaming output §6"), and ``docs/protocols.md`` says what each
requirement means for runwire. A citation by a document's file name or
number, or by a note that lives outside the repository (a numbered pitfall,
an issue section), is a dead end for a maintainer: these tests keep them out.
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TREES = ("pipeline", "workers", "tests", "docs", "bench", "deploy", "scripts")
SUFFIXES = {".py", ".md", ".mjs", ".yaml", ".toml", ".sh", ""}
SKIP_DIRS = {"node_modules", "__pycache__", ".venv", "fixtures"}

# Spelled in pieces so this file does not match itself.
DEAD_ENDS = {
    "a protocol document by number": re.compile(r"\b[Ss]eed(?:\s+|_)00\d"),
    "a protocol document by file name": re.compile(r"\b00[0-4]_[0-9a-f]{16}\b"),
    "a numbered pitfall": re.compile("PIT" + r"FALLS\b"),
    "an issue by number": re.compile(r"\b[Ii]ssue\s+\d"),
    "the design notes (the invariants are in docs/architecture.md)": re.compile(r"\bDES" + r"IGN\b"),
}
CODE = re.compile(r"(?<![\w§-])(R[1-4]|T[1-5])\b")
TITLE = "Koder agent stream"


def files() -> list[Path]:
    found = [ROOT / "README.md"]
    for tree in TREES:
        for path in (ROOT / tree).rglob("*"):
            if path.is_file() and path.suffix in SUFFIXES and not SKIP_DIRS & set(path.parts):
                found.append(path)
    return found


def test_no_citation_points_outside_the_repository() -> None:
    bad = []
    for path in files():
        text = path.read_text(errors="replace")
        lines = text.splitlines()
        for what, pattern in DEAD_ENDS.items():  # on the whole text: a citation may wrap
            for match in pattern.finditer(text):
                number = text.count("\n", 0, match.start()) + 1
                bad.append(f"{path.relative_to(ROOT)}:{number}: {what}: {lines[number - 1].strip()[:100]}")
    assert not bad, (
        "cite the protocol documents by title and section (see docs/protocols.md, \"The documents\"), "
        "and say what behaviour a test guards instead of numbering it:\n" + "\n".join(bad)
    )


def test_requirement_codes_name_their_document() -> None:
    """A file that uses R1–R4 or T1–T5 names the Koder agent stream, whose codes they are."""
    bad = []
    for path in files():
        text = path.read_text(errors="replace")
        match = CODE.search(text)
        if match and TITLE not in text:
            line = text.count("\n", 0, match.start()) + 1
            bad.append(f"{path.relative_to(ROOT)}:{line}: {match.group(1)}")
    assert not bad, (
        f"write the first requirement code of a file as \"{TITLE} §4 R1\" / \"{TITLE} §7 T3\" "
        "(docs/protocols.md, \"Requirements\", says what each means):\n" + "\n".join(bad)
    )


def test_the_checks_can_fail() -> None:
    assert DEAD_ENDS["a protocol document by number"].search("as in " + "seed" + " 003 §4")
    assert DEAD_ENDS["a numbered pitfall"].search("PIT" + "FALLS 9")
    assert DEAD_ENDS["an issue by number"].search("Issue" + " 4 §6")
    assert any(p.search("DES" + "IGN invariant 2") for p in DEAD_ENDS.values())
    assert CODE.search("shaped per R1") and not CODE.search("§4 " + "R1".lower())
