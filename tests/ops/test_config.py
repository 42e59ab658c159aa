"""One configuration model: flag > RUNWIRE_* environment > config file > default."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result

from runwire.workers.cli import main

ENV_KEYS = (
    "RUNWIRE_PORT",
    "RUNWIRE_BUS",
    "RUNWIRE_STORE",
    "RUNWIRE_SECRET",
    "RUNWIRE_CONFIG",
    "RUNWIRE_HOST",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for key in ENV_KEYS:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.chdir(tmp_path)


def run(args: list[str], env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, args, env=env, catch_exceptions=False)


def effective(args: list[str], env: dict[str, str] | None = None) -> dict[str, dict[str, object]]:
    result = run([*args, "--json"], env)
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)["commands"]


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def test_each_layer_wins_over_the_next(tmp_path: Path) -> None:
    """flag > RUNWIRE_* environment > config file > default, with the source named."""
    config = write(tmp_path / "rw.toml", "[up]\nport = 9001\n")
    base = ["--config", str(config), "config", "up"]

    assert effective(["config", "up"])["up"]["port"] == {
        "value": 8765,
        "source": "default",
        "env": "RUNWIRE_PORT",
    }
    assert effective(base)["up"]["port"]["value"] == 9001
    assert effective(base)["up"]["port"]["source"] == "file"
    from_env = effective(base, {"RUNWIRE_PORT": "9002"})["up"]["port"]
    assert (from_env["value"], from_env["source"]) == (9002, "env")
    from_flag = effective([*base, "--port", "9003"], {"RUNWIRE_PORT": "9002"})["up"]["port"]
    assert (from_flag["value"], from_flag["source"]) == (9003, "flag")


def test_top_level_keys_apply_to_every_command_and_sections_override(tmp_path: Path) -> None:
    config = write(
        tmp_path / "runwire.toml",
        'bus = "redis://shared:6379/0"\nurl = "http://edge:8765"\n[up]\nbus = "kafka://k:9092"\n',
    )
    commands = effective(["--config", str(config), "config"])
    assert commands["up"]["bus"] == {
        "value": "kafka://k:9092",
        "source": "file",
        "env": "RUNWIRE_BUS",
    }
    assert commands["tail"]["url"]["value"] == "http://edge:8765"
    assert "bus" not in commands["tail"]


def test_runwire_toml_in_the_working_directory_is_found(tmp_path: Path) -> None:
    write(tmp_path / "runwire.toml", "[up]\nhost = '::1'\ndata-dir = 'state'\n")
    result = run(["config", "up", "--json"])
    report = json.loads(result.stdout)
    assert report["config_file"] == "runwire.toml"
    assert report["commands"]["up"]["host"]["value"] == "::1"
    assert report["commands"]["up"]["data_dir"]["value"] == str(tmp_path.resolve() / "state")


def test_runwire_config_env_names_the_file(tmp_path: Path) -> None:
    config = write(tmp_path / "elsewhere.toml", "[up]\nport = 7000\n")
    commands = effective(["config", "up"], {"RUNWIRE_CONFIG": str(config)})
    assert commands["up"]["port"]["value"] == 7000


def test_file_values_reach_the_running_command(tmp_path: Path) -> None:
    """A value from the file is what the command actually runs with (not only what config prints)."""
    config = write(
        tmp_path / "runwire.toml", "[tail]\nurl = 'http://127.0.0.1:9'\nretry-for = 0.3\n"
    )
    result = CliRunner().invoke(main, ["--config", str(config), "tail", "r1", "--plain"])
    assert result.exit_code == 1
    assert "unreachable for 0.3s" in result.output


@pytest.mark.parametrize(
    ("text", "named"),
    [
        ("[up]\nprot = 1\n", "'prot' in [up]"),
        ("[uq]\nport = 1\n", "unknown section [uq]"),
        ("prot = 1\n", "unknown key 'prot'"),
        ("[up\n", "invalid TOML"),
    ],
)
def test_unknown_keys_and_bad_files_are_rejected_naming_key_and_file(
    tmp_path: Path, text: str, named: str
) -> None:
    config = write(tmp_path / "bad.toml", text)
    result = CliRunner().invoke(main, ["--config", str(config), "config", "up"])
    assert result.exit_code == 1
    assert named in result.output
    assert str(config) in result.output


def test_missing_config_file_is_an_error(tmp_path: Path) -> None:
    result = CliRunner().invoke(main, ["--config", str(tmp_path / "nope.toml"), "config"])
    assert result.exit_code == 1
    assert "no such config file" in result.output


def test_secrets_are_redacted(tmp_path: Path) -> None:
    """RUNWIRE_SECRET and passwords in URLs never appear in `runwire config` output."""
    config = write(tmp_path / "runwire.toml", "[up]\nbus = 'redis://:hunter2@redis:6379/0'\n")
    env = {
        "RUNWIRE_SECRET": "s3cr3t-key",
        "RUNWIRE_STORE": "postgresql://app:pa55word@db/runwire?sslpassword=x1y2&sslmode=require",
    }
    for args in (["config", "up"], ["config", "up", "--json"]):
        result = run(["--config", str(config), *args], env)
        assert result.exit_code == 0, result.output
        for secret in ("s3cr3t-key", "hunter2", "pa55word", "x1y2"):
            assert secret not in result.output
    commands = effective(["--config", str(config), "config", "up"], env)["up"]
    assert commands["secret"]["value"] == "***"
    assert commands["bus"]["value"] == "redis://:***@redis:6379/0"
    assert (
        commands["store"]["value"]
        == "postgresql://app:***@db/runwire?sslpassword=***&sslmode=require"
    )


def test_text_output_names_value_and_source(tmp_path: Path) -> None:
    config = write(tmp_path / "runwire.toml", "[up]\nport = 9001\n")
    result = run(
        ["--config", str(config), "config", "up", "--bus", "redis://r:1/0"], {"RUNWIRE_HOST": "::1"}
    )
    lines = {line.split("=")[0].strip(): line for line in result.stdout.splitlines() if "=" in line}
    assert lines["port"].endswith(f"(file {config})")
    assert lines["bus"].endswith("(flag)")
    assert lines["host"].endswith("(env RUNWIRE_HOST)")
    assert lines["group"].endswith("(default)")


def test_group_sections_reach_their_subcommands(tmp_path: Path) -> None:
    """`[replay]` keys apply to every replay subcommand; `[replay.export]` to that one; flags win."""
    config = write(
        tmp_path / "runwire.toml",
        'store = "sqlite:///top.db"\n[replay]\nstore = "sqlite:///replay.db"\n'
        '[replay.export]\nformat = "agui"\n',
    )
    commands = effective(["--config", str(config), "config", "replay"])
    assert commands["replay export"]["format"]["value"] == "agui"
    assert {commands[name]["store"]["value"] for name in commands} == {f"sqlite:///{tmp_path.resolve()}/replay.db"}
    flagged = effective(
        ["--config", str(config), "config", "replay", "export", "--format", "koder"]
    )
    assert (
        flagged["replay export"]["format"]["value"],
        flagged["replay export"]["format"]["source"],
    ) == ("koder", "flag")
    assert (
        effective(["--config", str(config), "config", "up"])["up"]["store"]["value"]
        == f"sqlite:///{tmp_path.resolve()}/top.db"
    )


def test_relative_store_and_data_paths_are_taken_from_the_working_directory_in_full(tmp_path: Path) -> None:
    """A relative SQLite path or ``--data-dir`` names a place under the working directory, and every
    command says which in full — never a fresh empty log somewhere unexpected; absolute paths,
    in-memory logs and other stores are kept as they are."""
    for command in ("up", "edge", "worker"):
        got = effective(["config", command, "--store", "sqlite:///logs/x.db?retention=7d"])
        stores = {value["store"]["value"] for value in got.values()}
        assert stores == {f"sqlite:///{tmp_path.resolve()}/logs/x.db?retention=7d"}
    for kept in ("sqlite:////var/lib/rw.db", "sqlite:///:memory:", "postgresql://db/runwire"):
        assert effective(["config", "edge", "--store", kept])["edge"]["store"]["value"] == kept
    up = effective(["config", "up", "--data-dir", "state"])["up"]
    assert up["data_dir"]["value"] == str(tmp_path.resolve() / "state")


CONVENTIONS = {
    "bus": "RUNWIRE_BUS",
    "store": "RUNWIRE_STORE",
    "group": "RUNWIRE_GROUP",
    "name": "RUNWIRE_NAME",
    "host": "RUNWIRE_HOST",
    "port": "RUNWIRE_PORT",
    "secret": "RUNWIRE_SECRET",
}


def test_every_command_reads_the_shared_options_from_the_same_variables() -> None:
    """One configuration model: wherever --bus, --store, --group, --name, --host, --port or
    --secret appear, they read the same RUNWIRE_* variable (and so the same file key)."""
    commands = effective(["config"])
    checked = 0
    for name, options in commands.items():
        for key, env in CONVENTIONS.items():
            if key in options:
                assert options[key]["env"] == env, f"runwire {name} --{key}"
                checked += 1
    assert checked >= 10
    for name in ("up", "worker", "edge"):
        assert {"bus", "store"} <= set(commands[name]), name
