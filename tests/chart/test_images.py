"""The operator and engine images: hadolint and the images' contracts with the chart and the CRD.

There is no container engine here, so the images are not built. The engine image's patch step
runs for real against each supported SGLang release's own wheel in
tests/conformance/test_patches.py.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from dsv4_operator.engine.releases import supported_versions

from .support import REPO, render, run, tool

ENGINE = REPO / "images" / "engine"


def _hadolint(dockerfile: Path) -> subprocess.CompletedProcess[str]:
    return run(
        [tool("hadolint"), "--no-color", "--failure-threshold", "warning", dockerfile],
        check=False,
    )


@pytest.mark.parametrize("dockerfile", [REPO / "Dockerfile", ENGINE / "Dockerfile"])
def test_hadolint_passes_at_the_warning_threshold(dockerfile: Path) -> None:
    proc = _hadolint(dockerfile)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_hadolint_fails_a_dockerfile_with_a_warning(tmp_path: Path) -> None:
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM python:3.11-slim\nRUN cd /tmp && pip install requests\n")
    proc = _hadolint(bad)
    assert proc.returncode != 0 and "DL3003" in proc.stdout


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    lines = [
        line for line in dockerfile.read_text().splitlines() if not line.lstrip().startswith("#")
    ]
    text = "\n".join(lines).replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        if line.strip():
            keyword, _, rest = line.strip().partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_operator_image_runs_dsv4_run_as_non_root_from_a_pinned_base() -> None:
    steps = _instructions(REPO / "Dockerfile")
    args = dict(s[1].split("=", 1) for s in steps if s[0] == "ARG" and "=" in s[1])
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.11\.\d+-slim(-\w+)?", base), base
    assert [s for s in steps if s[0] == "FROM"][-1][1] == "${PYTHON_IMAGE}"
    user = [s[1] for s in steps if s[0] == "USER"][-1]
    assert re.fullmatch(r"[1-9]\d*:[1-9]\d*", user), "numeric non-root user (runAsNonRoot)"
    entrypoint = json.loads(next(s[1] for s in steps if s[0] == "ENTRYPOINT"))
    cmd = json.loads(next(s[1] for s in steps if s[0] == "CMD"))
    assert entrypoint + cmd == ["dsv4", "run"]
    # The chart runs the same user and passes the same command.
    deployment = next(o for o in render() if o["kind"] == "Deployment")
    pod = deployment["spec"]["template"]["spec"]
    assert f"{pod['securityContext']['runAsUser']}:{pod['securityContext']['runAsGroup']}" == user
    assert pod["containers"][0]["args"] == cmd
    exposed = {int(p) for s in steps if s[0] == "EXPOSE" for p in s[1].split()}
    assert exposed == {8080, 8081, 9443}
    # Dependencies are the pyproject pins (exact versions), installed by `pip install .`.
    pyproject = (REPO / "pyproject.toml").read_text()
    deps = re.search(r"^dependencies = \[(.*?)\]", pyproject, re.S | re.M)
    assert deps is not None
    for dep in re.findall(r'"([^"]+)"', deps.group(1)):
        assert re.fullmatch(r"[\w.-]+(\[[\w,]+\])?==[\w.]+", dep), f"unpinned dependency {dep}"
    assert any(s[0] == "RUN" and "pip install --no-compile ." in s[1] for s in steps)


def test_dockerignore_sends_only_what_the_image_needs() -> None:
    lines = [
        line.strip()
        for line in (REPO / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    assert lines[0] == "**"
    assert {"!pyproject.toml", "!README.md", "!operator/"} <= set(lines)
    copied = {
        s[1].split()[0]
        for s in _instructions(REPO / "Dockerfile")
        if s[0] == "COPY" and "--from" not in s[1]
    }
    assert copied == {"pyproject.toml", "operator"}


def _capabilities_enum() -> set[str]:
    crd = yaml.safe_load((REPO / "crds" / "dsv4.io_dsv4deployments.yaml").read_text())
    engine = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"][
        "properties"
    ]["engine"]
    return set(engine["properties"]["capabilities"]["items"]["enum"])


def test_engine_image_declares_capabilities_the_crd_knows() -> None:
    steps = _instructions(ENGINE / "Dockerfile")
    args = dict(s[1].split("=", 1) for s in steps if s[0] == "ARG" and "=" in s[1])
    declared = args["CAPABILITIES"].split(",")
    assert declared == ["bf16IndexK", "poolSizingFix", "toolCallDropCounter"]
    assert set(declared) <= _capabilities_enum()
    label = next(s[1] for s in steps if s[0] == "LABEL")
    assert 'dsv4.io/capabilities="${CAPABILITIES}"' in label
    base = args["SGLANG_IMAGE"]
    assert re.search(r":[\w.-]*\d[\w.-]*$|@sha256:[0-9a-f]{64}$", base), f"unpinned base {base}"
    assert [s for s in steps if s[0] == "FROM"] == [("FROM", "${SGLANG_IMAGE}")]
    # The image says which SGLang release it carries; the example names the same release.
    assert 'dsv4.io/sglang-version="${SGLANG_VERSION}"' in label
    assert args["SGLANG_VERSION"] in supported_versions()
    assert (ENGINE / "patches" / args["SGLANG_VERSION"]).is_dir()
    # The example deployment's image declares the same capabilities and release.
    example = yaml.safe_load((REPO / "examples" / "dsv4.yaml").read_text())
    assert example["spec"]["engine"]["capabilities"] == declared
    assert example["spec"]["engine"]["sglangVersion"] == args["SGLANG_VERSION"]


def test_every_supported_release_has_engine_patches() -> None:
    assert sorted(p.name for p in (ENGINE / "patches").iterdir()) == sorted(supported_versions())
