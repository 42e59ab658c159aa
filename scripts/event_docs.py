"""Write docs/events.md from the event Structs: every event type, its envelope fields and payload.

    .venv/bin/python scripts/event_docs.py          # rewrites docs/events.md
    .venv/bin/python scripts/event_docs.py --check  # exit 1 when docs/events.md is out of date

tests/test_event_docs.py runs the check, so the page can't drift from the code.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import msgspec
from msgspec import inspect

from runwire.core.events import CORE_TYPES, EVENT_CLASSES, Envelope

DOC = Path(__file__).resolve().parents[1] / "docs" / "events.md"

HEAD = """# Events

Every event runwire carries, generated from the Structs in `pipeline/core/events.py`
(`scripts/event_docs.py`; a test fails when this page and the code disagree). An event is the
envelope's fields plus a `type` and its `payload`; unknown fields are refused
(`KAI-STREAM-PROTO-0001`), optional ones may be left out, and an explicit `null` stays `null`.
The core types are the Koder agent stream's eight (§3); `x.*` types are runwire's own and map
onto every format by `docs/protocols.md`.
"""


def describe(kind: inspect.Type) -> str:
    """A field's type in a few words (JSON terms)."""
    if isinstance(kind, inspect.UnionType):
        parts = [describe(t) for t in kind.types]
        return " or ".join(dict.fromkeys(parts))
    if isinstance(kind, inspect.StrType):
        return "string" + (f" (≤ {kind.max_length} chars)" if kind.max_length else "")
    if isinstance(kind, inspect.IntType):
        return "integer" + (" ≥ 0" if kind.ge == 0 else "")
    if isinstance(kind, inspect.FloatType):
        return "number"
    if isinstance(kind, inspect.BoolType):
        return "boolean"
    if isinstance(kind, inspect.NoneType):
        return "null"
    if isinstance(kind, inspect.AnyType):
        return "any JSON"
    if isinstance(kind, inspect.LiteralType):
        return " \\| ".join(f"`{v}`" for v in kind.values)
    if isinstance(kind, inspect.ListType):
        return f"list of {describe(kind.item_type)}"
    if isinstance(kind, inspect.DictType):
        return f"object of {describe(kind.value_type)}"
    if isinstance(kind, inspect.StructType):
        return f"`{kind.cls.__name__}`"
    return type(kind).__name__.removesuffix("Type").lower()


def _default(field: inspect.Field) -> str:
    if field.required:
        return "required"
    if field.default is msgspec.UNSET or field.default is msgspec.NODEFAULT:
        return "optional"
    return f"optional, default `{msgspec.json.encode(field.default).decode()}`"


NOTES = {
    "id": "ULID, monotonic per stream",
    "ts": "RFC 3339 timestamp (a real instant; `t`/`z` may be lowercase)",
    "seq": "the publisher's seq per run (1, 2, 3 …); a delivery stream's own seq on the way out",
    "child_id": "the child run an event in a parent's stream came from (set by fan-in)",
    "span": "`[first, last]` seqs a shaped delta accounts for (the shaped view)",
    "parent_id": "a child run's parent", "root_id": "a child run's root",
}


def table(struct: Any) -> list[str]:
    info = inspect.type_info(struct)
    assert isinstance(info, inspect.StructType)
    notes = NOTES if struct is Envelope else {}
    rows = ["| field | type | |", "|---|---|---|"]
    for field in info.fields:
        if field.encode_name in ("type", "payload"):
            continue
        note = f"; {notes[field.encode_name]}" if field.encode_name in notes else ""
        rows.append(f"| `{field.encode_name}` | {describe(field.type)} | {_default(field)}{note} |")
    return rows


def nested(struct: Any, seen: set[type]) -> list[type]:
    """Structs used inside a payload (a plan's steps …), each once."""
    found: list[type] = []
    for field in inspect.type_info(struct).fields:  # type: ignore[union-attr]
        stack = [field.type]
        while stack:
            kind = stack.pop()
            if isinstance(kind, inspect.StructType) and kind.cls not in seen:
                seen.add(kind.cls)
                found.append(kind.cls)
                found.extend(nested(kind.cls, seen))
            stack.extend(getattr(kind, "types", ()))
            for attr in ("item_type", "value_type"):
                if hasattr(kind, attr):
                    stack.append(getattr(kind, attr))
    return found


def render() -> str:
    out = [HEAD, "## The envelope (every event)", "", *table(Envelope), "",
           "`type` names the event; `payload` is the type's own object, below.", ""]
    core = {cls.type_name for cls in CORE_TYPES}
    seen: set[type] = set()
    for name, cls in sorted(EVENT_CLASSES.items(), key=lambda item: (item[0] not in core, item[0])):
        payload = inspect.type_info(cls).fields  # type: ignore[union-attr]
        kind = next(f.type for f in payload if f.encode_name == "payload")
        assert isinstance(kind, inspect.StructType)
        doc = (cls.__doc__ or "").strip().splitlines()[0] if cls.__doc__ else ""
        out += [f"## `{name}`" + (" (core)" if name in core else ""), ""]
        if doc and not doc.startswith(("A base", "Fields every")):
            out += [doc, ""]
        out += [f"Payload `{kind.cls.__name__}`:", "", *table(kind.cls), ""]
        for inner in nested(kind.cls, seen):
            out += [f"`{inner.__name__}`:", "", *table(inner), ""]
    return "\n".join(out).rstrip() + "\n"


def main() -> int:
    text = render()
    if "--check" in sys.argv:
        if not DOC.exists() or DOC.read_text() != text:
            print("docs/events.md is out of date: run .venv/bin/python scripts/event_docs.py", file=sys.stderr)
            return 1
        return 0
    DOC.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
