"""docs/events.md is generated from the event Structs (scripts/event_docs.py) and never drifts."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_the_events_page_matches_the_structs() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "scripts" / "event_docs.py"), "--check"],
                          capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr


def test_the_events_page_names_every_event_type_and_payload_field() -> None:
    from runwire.core.events import EVENT_CLASSES

    page = (ROOT / "docs" / "events.md").read_text()
    for name, cls in EVENT_CLASSES.items():
        assert f"## `{name}`" in page
        payload = cls.__annotations__.get("payload")
        assert payload is not None
