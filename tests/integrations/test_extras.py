"""Each integration is an optional extra: ``import runwire`` (and the integrations package)
loads no framework, and a module whose framework is missing says which extra to install."""

from __future__ import annotations

import subprocess
import sys

import pytest

from runwire.integrations import EXTRAS

FRAMEWORKS = ("pydantic_ai", "agents", "langgraph", "google.adk")


def python(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False)


def test_importing_runwire_and_its_integrations_package_loads_no_framework() -> None:
    done = python("import sys, runwire, runwire.integrations, runwire.integrations.agentrun; "
                  f"print([m for m in {FRAMEWORKS!r} if m in sys.modules])")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("integration", sorted(EXTRAS))
def test_a_missing_framework_names_the_extra_to_install(integration: str) -> None:
    extra, module = EXTRAS[integration]
    blocked = module.split(".")[0] if module != "google.adk" else "google.adk"
    done = python(f"import sys; sys.modules[{blocked!r}] = None\n"
                  f"import runwire.integrations.{integration}")
    assert done.returncode != 0
    last = done.stderr.strip().splitlines()[-1]
    assert last == (f"ImportError: runwire.integrations.{integration} needs {module}: "
                    f'pip install "runwire[{extra}]"'), done.stderr[-2000:]
