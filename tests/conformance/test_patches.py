"""The engine image's patches, applied to each release's own wheel the way the image build does.

`images/engine/patches/<version>/` must apply with `git apply` (no fuzz) to that release's
`pool_configurator.py`; the Dockerfile's patch step (run here with bash against a copy of the
wheel's module) applies them and checks its markers; and the patched configurator then sizes
index-K exactly as the operator's planner does for an image with `poolSizingFix`.
"""

from __future__ import annotations

import copy
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from dsv4_operator.api.roles import ROLES

from .matrix import EAGLE, EXAMPLES, cases_from
from .release_env import MODEL_DIR, REPO, ask, release_python

pytestmark = pytest.mark.conformance

ENGINE = REPO / "images" / "engine"
MODULE = Path("sglang") / "srt" / "model_executor" / "pool_configurator.py"


def _wheel_module(version: str) -> Path:
    out = subprocess.run(
        [
            release_python(version),
            "-c",
            "import sglang, os; print(os.path.dirname(sglang.__file__))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(out).parent / MODULE


def _site_copy(version: str, root: Path) -> Path:
    """A site-packages holding the wheel's pool_configurator.py (and its dist-info version)."""
    site = root / "site-packages"
    target = site / MODULE
    target.parent.mkdir(parents=True)
    for package in (site / "sglang", site / "sglang" / "srt", target.parent):
        (package / "__init__.py").touch()
    shutil.copy(_wheel_module(version), target)
    info = site / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")
    return site


def _patch_steps() -> str:
    """The Dockerfile's RUN steps that check the version and apply the patches."""
    text = (ENGINE / "Dockerfile").read_text()
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    runs = [m.replace("\\\n", " ") for m in re.findall(r"^RUN (.*?)(?=^\S|\Z)", text, re.S | re.M)]
    return " && ".join(f"( {r.strip()} )" for r in runs).replace(
        "/opt/dsv4/patches", str(ENGINE / "patches")
    )


def _run_steps(site: Path, version: str, capabilities: str) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "SGLANG_VERSION": version,
        "CAPABILITIES": capabilities,
    }
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", _patch_steps()],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def test_every_release_has_patches_and_they_apply_without_fuzz(
    version: str, tmp_path: Path
) -> None:
    patches = sorted((ENGINE / "patches" / version).glob("*.patch"))
    assert patches, f"no patches for sglang {version}"
    checkout = tmp_path / "sglang"
    (checkout / "python" / MODULE).parent.mkdir(parents=True)
    shutil.copy(_wheel_module(version), checkout / "python" / MODULE)
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    for patch in patches:
        assert "Capability: poolSizingFix" in patch.read_text()
        proc = subprocess.run(
            ["git", "apply", "--check", "-v", str(patch)],
            cwd=checkout,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
    other = [v for v in ("0.5.16", "0.5.23") if v != version]
    for foreign in other:  # a release's patch is not silently taken for another's
        for patch in sorted((ENGINE / "patches" / foreign).glob("*.patch")):
            proc = subprocess.run(
                ["git", "apply", "--check", str(patch)],
                cwd=checkout,
                capture_output=True,
                check=False,
            )
            assert proc.returncode != 0, (patch, version)


def test_image_patch_step_applies_checks_and_refuses(version: str, tmp_path: Path) -> None:
    site = _site_copy(version, tmp_path / "ok")
    proc = _run_steps(site, version, "poolSizingFix")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dsv4-operator poolSizingFix" in (site / MODULE).read_text()
    # applying twice fails (git apply is strict), so a base that already has it is noticed
    assert _run_steps(site, version, "poolSizingFix").returncode != 0
    # a base carrying another release is refused before any patch is tried
    wrong = _site_copy(version, tmp_path / "wrong")
    proc = _run_steps(wrong, "0.0.1", "poolSizingFix")
    assert proc.returncode != 0 and "not SGLANG_VERSION" in proc.stderr
    # bf16IndexK must come from the base: upstream wheels have no SGLANG_DSV4_BF16_INDEX_K
    proc = _run_steps(
        _site_copy(version, tmp_path / "upstream"), version, "bf16IndexK,poolSizingFix"
    )
    assert proc.returncode != 0
    assert "bf16IndexK is declared but the base has no SGLANG_DSV4_BF16_INDEX_K" in proc.stderr


def test_patched_configurator_sizes_index_k_like_the_planner(version: str, tmp_path: Path) -> None:
    site = _site_copy(version, tmp_path)
    assert _run_steps(site, version, "poolSizingFix").returncode == 0
    base = yaml.safe_load((EXAMPLES / "dsv4.yaml").read_text())["spec"]
    specs = []
    for dtype in ("fp8", "bf16", "fp4"):
        for speculative in (False, True):
            spec = copy.deepcopy(base)
            spec["engine"].update(
                sglangVersion=version,
                indexKDtype=dtype,
                capabilities=["bf16IndexK", "poolSizingFix"]
                if dtype == "bf16"
                else ["poolSizingFix"],
                extraArgs=EAGLE if speculative else [],
            )
            spec["gpu"] = {"product": "NVIDIA-B200"}
            spec["safety"] = {"policy": "Warn"}
            specs.append((f"{dtype}-spec{int(speculative)}", spec))
    request = {"pools": {}}
    expected = {}
    for case in cases_from(specs):
        for role in ROLES:
            plan = case.plan.roles[role]
            key = f"{case.id}/{role}"
            argv = case.engine_argv(role)
            argv[argv.index("--model-path") + 1] = str(MODEL_DIR)
            request["pools"][key] = {
                "argv": argv,
                "env": dict(case.launches[role].env),
                "modelDir": str(MODEL_DIR),
                "availableBytes": plan.available_bytes,
                "gpuArch": "sm100",
                "patchedSource": str(site / MODULE),
            }
            expected[key] = (plan.bytes_per_full_token, plan.max_total_tokens)
    answer = ask(version, request)["pools"]
    got = {
        k: (v.get("bytesPerFullToken"), v.get("full")) if v["ok"] else v for k, v in answer.items()
    }
    assert got == expected
    # the fix is what makes bf16 cost 651 B more per full token than fp8 on DeepSeek-V4-Flash
    assert got["bf16-spec0/decode"][0] - got["fp8-spec0/decode"][0] == pytest.approx(651)
