"""docs/operations.md lists every option of every command, as the code defines them."""

from __future__ import annotations

import re
from pathlib import Path

from click.testing import CliRunner

from runwire.workers.cli import main

DOC = Path(__file__).resolve().parents[2] / "docs" / "operations.md"


def test_operations_doc_lists_every_option_of_every_command() -> None:
    """If this fails, paste the output of `runwire config --reference` between the markers."""
    reference = CliRunner().invoke(main, ["config", "--reference"], catch_exceptions=False).stdout
    section = re.search(r"<!-- options:start -->\n(.*)<!-- options:end -->", DOC.read_text(), re.S)
    assert section is not None, "docs/operations.md lost its options markers"
    assert section.group(1) == reference
    for command in ("up", "worker", "edge", "tail", "replay sweep"):
        assert f"`runwire {command}`" in reference
