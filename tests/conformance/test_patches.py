"""The engine image's patches, applied to each release's own wheel the way the image build does.

`images/engine/patches/<version>/` must apply in order with `git apply` (no fuzz) to that
release's modules; the Dockerfile's patch step (run here with bash against a copy of the wheel's
modules) applies them and checks the markers of the capabilities it declares; and the patched
configurator then sizes index-K exactly as the operator's planner does for an image with
`poolSizingFix` (toolCallDropCounter's behaviour: test_tool_call_patch.py).
"""

from __future__ import annotations

import copy
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from dsv4_operator.api.engine import Capability
from dsv4_operator.api.roles import ROLES

from .image_build import (
    CONFIGURATOR,
    TOOL_PARSER,
    patched_modules,
    patches,
    run_steps,
    site_copy,
    wheel_root,
)
from .matrix import EAGLE, EXAMPLES, cases_from
from .release_env import MODEL_DIR, ask

pytestmark = pytest.mark.conformance

# Each patch file's capability, by its number: the image declares these names.
PATCH_CAPABILITIES = {"0001": Capability.POOL_SIZING_FIX, "0002": Capability.TOOL_CALL_DROP_COUNTER}
PATCHED = "poolSizingFix,toolCallDropCounter"


def test_every_release_has_patches_and_they_apply_in_order_without_fuzz(
    version: str, tmp_path: Path
) -> None:
    found = patches(version)
    assert [p.name[:4] for p in found] == sorted(PATCH_CAPABILITIES), found
    checkout = tmp_path / "sglang"
    for module in patched_modules(version):
        (checkout / "python" / module).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(wheel_root(version) / module, checkout / "python" / module)
    subprocess.run(["git", "init", "-q", str(checkout)], check=True)
    other = [v for v in ("0.5.16", "0.5.23") if v != version]
    for foreign in other:  # a release's patch is not silently taken for another's
        for patch in patches(foreign):
            proc = subprocess.run(
                ["git", "apply", "--check", str(patch)],
                cwd=checkout,
                capture_output=True,
                text=True,
                check=False,
            )
            assert proc.returncode != 0, (patch, version)
    for patch in found:  # each on top of the ones before it, as the image build does
        assert f"Capability: {PATCH_CAPABILITIES[patch.name[:4]].value} " in patch.read_text()
        proc = subprocess.run(
            ["git", "apply", "-v", str(patch)],
            cwd=checkout,
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr
        assert "with fuzz" not in proc.stderr and "offset" not in proc.stderr, proc.stderr


def test_image_patch_step_applies_checks_and_refuses(version: str, tmp_path: Path) -> None:
    site = site_copy(version, tmp_path / "ok")
    proc = run_steps(site, version, PATCHED)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "dsv4-operator poolSizingFix" in (site / CONFIGURATOR).read_text()
    assert "dsv4-operator toolCallDropCounter" in (site / TOOL_PARSER).read_text()
    # applying twice fails (git apply is strict), so a base that already has it is noticed
    assert run_steps(site, version, PATCHED).returncode != 0
    # a base carrying another release is refused before any patch is tried
    wrong = site_copy(version, tmp_path / "wrong")
    proc = run_steps(wrong, "0.0.1", PATCHED)
    assert proc.returncode != 0 and "not SGLANG_VERSION" in proc.stderr
    # bf16IndexK must come from the base: upstream wheels have no SGLANG_DSV4_BF16_INDEX_K
    proc = run_steps(site_copy(version, tmp_path / "upstream"), version, f"bf16IndexK,{PATCHED}")
    assert proc.returncode != 0
    assert "bf16IndexK is declared but the base has no SGLANG_DSV4_BF16_INDEX_K" in proc.stderr
    # a declared toolCallDropCounter needs its patch: a patch set without 0002 is refused
    only_pool = tmp_path / "patches"
    (only_pool / version).mkdir(parents=True)
    shutil.copy(patches(version)[0], only_pool / version)
    proc = run_steps(site_copy(version, tmp_path / "no-0002"), version, PATCHED, only_pool)
    assert proc.returncode != 0
    assert "toolCallDropCounter is declared but its patch is not in" in proc.stderr
    # and a patch that does not apply stops the build at once: 0002 is never tried
    broken = tmp_path / "broken"
    (broken / version).mkdir(parents=True)
    for patch in patches(version):
        shutil.copy(patch, broken / version)
    first = broken / version / patches(version)[0].name
    lines = first.read_text().splitlines(keepends=True)
    hunk = next(i for i, line in enumerate(lines) if line.startswith("@@"))
    context = next(i for i in range(hunk + 1, len(lines)) if lines[i].startswith(" "))
    lines[context] = " # not the release's line\n"
    first.write_text("".join(lines))
    stopped = site_copy(version, tmp_path / "broken-site")
    assert run_steps(stopped, version, "", broken).returncode != 0
    assert "dsv4-operator toolCallDropCounter" not in (stopped / TOOL_PARSER).read_text()


def test_patched_configurator_sizes_index_k_like_the_planner(version: str, tmp_path: Path) -> None:
    site = site_copy(version, tmp_path)
    assert run_steps(site, version, PATCHED).returncode == 0
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
    request: dict[str, dict[str, Any]] = {"pools": {}}
    expected: dict[str, Any] = {}
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
                "patchedSource": str(site / CONFIGURATOR),
            }
            expected[key] = (plan.bytes_per_full_token, plan.max_total_tokens)
    answer = ask(version, request)["pools"]
    got = {
        k: (v.get("bytesPerFullToken"), v.get("full")) if v["ok"] else v for k, v in answer.items()
    }
    assert got == expected
    # the fix is what makes bf16 cost 651 B more per full token than fp8 on DeepSeek-V4-Flash
    assert got["bf16-spec0/decode"][0] - got["fp8-spec0/decode"][0] == pytest.approx(651)
