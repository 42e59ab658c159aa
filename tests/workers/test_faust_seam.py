"""The faust seam's version guard: the Kafka worker refuses a faust-streaming it was not tested with."""

from __future__ import annotations

import uuid
from pathlib import Path

import faust
import pytest

from runwire.bus.kafka.bus import KafkaBus
from runwire.core.errors import ConfigError
from runwire.processing.faust.seam import (
    TESTED_FAUST_VERSIONS,
    UNTESTED_ENVVAR,
    check_faust_version,
)
from runwire.processing.faust.worker import FaustWorker
from runwire.store import open_store


def test_the_installed_faust_is_a_tested_one() -> None:
    assert faust.__version__ in TESTED_FAUST_VERSIONS
    check_faust_version()


def test_an_untested_faust_is_refused_with_the_versions_to_install(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(UNTESTED_ENVVAR, raising=False)
    with pytest.raises(ConfigError) as refused:
        check_faust_version("0.16.0")
    message = str(refused.value)
    assert "0.16.0" in message
    assert all(version in message for version in TESTED_FAUST_VERSIONS)
    assert UNTESTED_ENVVAR in message


def test_an_untested_faust_runs_when_the_operator_says_so(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(UNTESTED_ENVVAR, "1")
    check_faust_version("0.16.0")


async def test_the_worker_fails_at_start_on_an_untested_faust(
    kafka_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loudly, before it joins the group or writes anything (no data directory either)."""
    monkeypatch.delenv(UNTESTED_ENVVAR, raising=False)
    monkeypatch.setattr(faust, "__version__", "0.16.0")
    prefix = f"v{uuid.uuid4().hex[:8]}"
    bus = KafkaBus(f"{kafka_url}?prefix={prefix}")
    async with open_store(f"sqlite:///{tmp_path}/replay.db") as store:
        worker = FaustWorker(bus, store, group=f"{prefix}-g", name="v1", burst=True,
                             data_dir=tmp_path / "data")
        with pytest.raises(ConfigError, match="0.16.0"):
            await worker.run()
    assert not (tmp_path / "data").exists()
