"""``runwire token`` and ``runwire edge``'s refusal to serve without auth beyond loopback."""

from __future__ import annotations

from click.testing import CliRunner

from runwire.edge import verify_token
from runwire.workers.commands.edge import edge, is_loopback
from runwire.workers.commands.token import token

SECRET = "a-secret-of-at-least-thirty-two-bytes!"


def test_token_prints_a_token_the_edge_accepts() -> None:
    """`runwire token --tenant T [--run R]… [--scope …]… [--ttl S]` prints one HS256 token."""
    result = CliRunner().invoke(
        token,
        ["--tenant", "acme", "--run", "r1", "--run", "r2", "--scope", "read", "--scope", "control", "--ttl", "60"],
        env={"RUNWIRE_SECRET": SECRET},
    )
    assert result.exit_code == 0, result.output
    principal = verify_token(SECRET, result.output.strip())
    assert principal.tenant == "acme"
    assert principal.runs == ("r1", "r2")
    assert principal.scopes == frozenset({"read", "control"})


def test_token_needs_the_secret() -> None:
    result = CliRunner().invoke(token, ["--tenant", "acme"], env={"RUNWIRE_SECRET": None})
    assert result.exit_code != 0
    assert "RUNWIRE_SECRET" in result.output


def test_edge_without_a_secret_refuses_to_bind_beyond_loopback() -> None:
    """With no secret the edge refuses to bind anything but loopback."""
    result = CliRunner().invoke(edge, ["--host", "0.0.0.0"], env={"RUNWIRE_SECRET": None})
    assert result.exit_code == 2
    assert "loopback" in result.output
    assert is_loopback("127.0.0.1") and is_loopback("::1") and is_loopback("localhost")
    assert not is_loopback("10.0.0.1") and not is_loopback("example.com")
