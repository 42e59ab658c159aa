"""deploy/ checked without a container engine: the Dockerfile, the Kubernetes manifests, the compose file.

Each check also runs on a broken copy, so a checker that silently passes
everything fails here.
"""

from __future__ import annotations

import copy
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
BIN = Path(sys.executable).parent
HINT = "scripts/bootstrap installs it with the test extras (pip install -e '.[test]')"
# The oldest Kubernetes the manifests promise to apply to, and the newest the validator knows.
KUBERNETES = ("1.29", kubernetes_validate.latest_version())


def tool(name: str) -> str:
    found = BIN / name
    if found.exists():
        return str(found)
    which = shutil.which(name)
    if which is None:
        pytest.fail(f"{name} not found: {HINT}", pytrace=False)
    return which


def run(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)


# ---- Dockerfile ---------------------------------------------------------------------------


def hadolint(path: Path) -> subprocess.CompletedProcess[str]:
    # Fails on every finding (warnings and infos included), with no config file of the machine.
    return run(tool("hadolint"), "--no-color", "--failure-threshold", "info", "--config", "/dev/null", str(path))


def test_dockerfile_passes_hadolint() -> None:
    result = hadolint(DEPLOY / "Dockerfile")
    assert result.returncode == 0, f"hadolint deploy/Dockerfile:\n{result.stdout}{result.stderr}"


def test_hadolint_rejects_an_unpinned_image(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:latest\nRUN pip install requests\n")
    result = hadolint(bad)
    assert result.returncode != 0 and "DL3007" in result.stdout and "DL3013" in result.stdout


# ---- Kubernetes ---------------------------------------------------------------------------


def manifests() -> list[tuple[str, dict[str, Any]]]:
    found = []
    for path in sorted(K8S.glob("*.yaml")):
        if path.name == "kustomization.yaml":
            continue
        for doc in yaml.safe_load_all(path.read_text()):
            if doc:
                found.append((f"{path.name}: {doc['kind']}/{doc['metadata']['name']}", doc))
    return found


@pytest.mark.parametrize("version", KUBERNETES)
def test_kubernetes_manifests_match_the_api_schemas(version: str) -> None:
    """Strict: a misspelt or misplaced field is an error, not silently ignored by the API server."""
    errors = []
    for name, doc in manifests():
        try:
            kubernetes_validate.validate(doc, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{name}: {exc.message} at {'.'.join(map(str, exc.path))}")
    assert not errors, f"against Kubernetes {version}:\n" + "\n".join(errors)


def test_kubernetes_validation_rejects_a_misspelt_field() -> None:
    deployment = next(doc for _, doc in manifests() if doc["kind"] == "Deployment")
    bad = copy.deepcopy(deployment)
    bad["spec"]["replica"] = bad["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(bad, KUBERNETES[-1], strict=True)


def test_kustomization_applies_every_manifest_and_names_the_image() -> None:
    kustomization = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    files = {path.name for path in K8S.glob("*.yaml")} - {"kustomization.yaml"}
    assert set(kustomization["resources"]) == files
    images = {c["image"] for _, doc in manifests() for c in containers(doc)}
    assert images == {image["name"] for image in kustomization["images"]}


def containers(doc: dict[str, Any]) -> list[dict[str, Any]]:
    spec = doc.get("spec", {})
    if doc["kind"] == "CronJob":
        spec = spec["jobTemplate"]["spec"]
    pod = spec.get("template", {}).get("spec", {})
    return list(pod.get("containers", []))


def test_every_pod_runs_as_the_images_user() -> None:
    """The Dockerfile's numeric USER is the runAsUser of every pod, and runAsNonRoot holds."""
    user = next(line.split()[1] for line in (DEPLOY / "Dockerfile").read_text().splitlines()
                if line.startswith("USER "))
    for name, doc in manifests():
        if not containers(doc):
            continue
        spec = doc["spec"]["jobTemplate"]["spec"] if doc["kind"] == "CronJob" else doc["spec"]
        security = spec["template"]["spec"]["securityContext"]
        assert security == {"runAsNonRoot": True, "runAsUser": int(user)}, name


# ---- compose ------------------------------------------------------------------------------


def check_compose(path: Path) -> subprocess.CompletedProcess[str]:
    # The Compose specification's schema ships inside check-jsonschema: no network needed.
    return run(tool("check-jsonschema"), "--builtin-schema", "vendor.compose-spec", str(path))


def test_compose_file_matches_the_compose_specification() -> None:
    result = check_compose(DEPLOY / "compose.yaml")
    assert result.returncode == 0, f"deploy/compose.yaml:\n{result.stdout}{result.stderr}"


def test_compose_check_rejects_a_bad_service(tmp_path: Path) -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    compose["services"]["worker"]["restart"] = {"policy": "always"}
    bad = tmp_path / "compose.yaml"
    bad.write_text(yaml.safe_dump(compose))
    result = check_compose(bad)
    assert result.returncode != 0, result.stdout
