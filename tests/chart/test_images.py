"""The operator and engine images: hadolint, the operator image's contract with the chart, and
the engine image's patch step run for real (bash + git apply) against a stand-in sglang.

There is no container engine here, so the images are not built. The engine patch is verified
only by building on its pinned base (images/engine/README.md); what is checked here is that the
Dockerfile's patch step applies the patch, that the patched arithmetic gives the operator
planner's numbers, and that a capability the base lacks fails the step.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from .support import CHART, REPO, render, run, tool

ENGINE = REPO / "images" / "engine"
PATCHES = ENGINE / "patches"
CONFIGURATOR = Path("sglang") / "srt" / "model_executor" / "pool_configurator.py"

# Only the lines of sglang's pool_configurator.py (@003fca80) that the patch touches or uses as
# context, inside a minimal class written for this test; the byte formula is reference 3.4's.
STAND_IN = textwrap.dedent(
    '''\
    """Stand-in for sglang's pool_configurator.py (tests only)."""

    from __future__ import annotations

    import logging
    from dataclasses import dataclass

    logger = logging.getLogger(__name__)


    class DSV4PoolConfigurator:
        def __init__(self, kvc):
            cfg = kvc.model_config
            self.qk_nope_head_dim = cfg.qk_nope_head_dim
            self.qk_rope_head_dim = cfg.qk_rope_head_dim
            self.indexer_head_dim = cfg.index_head_dim
            self.compression_ratios = cfg.compress_ratios
            self.swa_page_size = cfg.window_size
            self.swa_ratio = kvc.server_args.swa_full_tokens_ratio
            self.c4_ring_size = 8
            self.c4_shrink_factor = 1
            self.num_layers_total = len(self.compression_ratios)
            self.num_layers_ca4 = sum(1 for r in self.compression_ratios if r == 4)
            self.num_layers_ca128 = sum(1 for r in self.compression_ratios if r == 128)

            self.bytes_per_full_token = self._get_bytes_per_full_token()

        def _get_bytes_per_full_token(self) -> float:
            kv_bytes = self.qk_nope_head_dim + self.qk_rope_head_dim * 2 + 8

            quant_block_size = 128
            indexer_bytes = (
                self.indexer_head_dim + self.indexer_head_dim // quant_block_size * 4
            )

            attn_head_dim = self.qk_nope_head_dim + self.qk_rope_head_dim
            self.indexer_bytes = indexer_bytes
            c4_state_bytes = 2 * 2 * attn_head_dim * 4
            c4_indexer_state_bytes = 2 * 2 * self.indexer_head_dim * 4
            c4_state_ratio = self.c4_ring_size / self.swa_page_size
            c4_frac = 1 / (4 * self.c4_shrink_factor)
            return (
                self.swa_ratio * kv_bytes * self.num_layers_total
                + c4_frac * kv_bytes * self.num_layers_ca4
                + 1 / 128 * kv_bytes * self.num_layers_ca128
                + 1 / 4 * indexer_bytes * self.num_layers_ca4
                + self.swa_ratio * c4_state_ratio * c4_state_bytes * self.num_layers_ca4
                + self.swa_ratio * c4_state_ratio * c4_indexer_state_bytes * self.num_layers_ca4
            )
    '''
)

# DeepSeek-V4-Flash as the engine sees it (reference 3.1): 2 SWA-only, 21 C4, 20 C128 layers.
PROBE = textwrap.dedent(
    """\
    import json, sys
    from types import SimpleNamespace as NS
    from sglang.srt.model_executor.pool_configurator import DSV4PoolConfigurator
    ratios = [0, 0] + [4, 128] * 20 + [4]
    kvc = NS(
        model_config=NS(qk_nope_head_dim=448, qk_rope_head_dim=64, index_head_dim=128,
                        compress_ratios=ratios, window_size=128),
        server_args=NS(swa_full_tokens_ratio=0.1,
                       enable_deepseek_v4_fp4_indexer=sys.argv[1] == "fp4"),
    )
    c = DSV4PoolConfigurator(kvc)
    print(json.dumps({"indexer": c.indexer_bytes, "total": round(c.bytes_per_full_token, 2)}))
    """
)


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
    assert declared == ["bf16IndexK", "poolSizingFix"]
    assert set(declared) <= _capabilities_enum()
    label = next(s[1] for s in steps if s[0] == "LABEL")
    assert 'dsv4.io/capabilities="${CAPABILITIES}"' in label
    base = args["SGLANG_IMAGE"]
    assert re.search(r":[\w.-]*\d[\w.-]*$|@sha256:[0-9a-f]{64}$", base), f"unpinned base {base}"
    assert [s for s in steps if s[0] == "FROM"] == [("FROM", "${SGLANG_IMAGE}")]
    # The example deployment's image declares the same capabilities.
    example = yaml.safe_load((REPO / "examples" / "dsv4.yaml").read_text())
    assert example["spec"]["engine"]["capabilities"] == declared


def _patch_step() -> str:
    """The Dockerfile's RUN step that applies the patches, pointed at the repository's patches."""
    run_step = next(
        s[1] for s in _instructions(ENGINE / "Dockerfile") if s[0] == "RUN" and "patch" in s[1]
    )
    return run_step.replace("/opt/dsv4/patches", str(PATCHES))


def _stand_in(root: Path, fork: bool) -> Path:
    """A git checkout holding python/sglang (as an editable install has it); the fork variant
    also carries a module that reads SGLANG_DSV4_BF16_INDEX_K."""
    python = root / "python"
    module = python / CONFIGURATOR
    module.parent.mkdir(parents=True)
    for package in (python / "sglang", python / "sglang" / "srt", module.parent):
        (package / "__init__.py").write_text("")
    module.write_text(STAND_IN)
    if fork:
        pool = python / "sglang" / "srt" / "mem_cache" / "deepseek_v4_memory_pool.py"
        pool.parent.mkdir()
        pool.write_text('import os\nBF16 = os.environ.get("SGLANG_DSV4_BF16_INDEX_K") == "1"\n')
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return python


def _run_step(python: Path, capabilities: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "CAPABILITIES": capabilities, "PYTHONPATH": str(python)}
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", _patch_step()],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def _probe(python: Path, dtype: str) -> dict[str, Any]:
    env = {**os.environ, "PYTHONPATH": str(python)}
    env["SGLANG_DSV4_BF16_INDEX_K"] = "1" if dtype == "bf16" else "0"
    out = subprocess.run(
        [sys.executable, "-c", PROBE, dtype], env=env, capture_output=True, text=True, check=True
    ).stdout
    result: dict[str, Any] = json.loads(out)
    return result


def _planner(dtype: str) -> float:
    doc = (
        (REPO / "examples" / "dsv4.yaml")
        .read_text()
        .replace("indexKDtype: fp8", f"indexKDtype: {dtype}")
    )
    out = subprocess.run(
        [sys.executable, "-m", "dsv4_operator.cli", "plan", "-f", "-", "-o", "json"],
        input=doc,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    total: float = json.loads(out)["roles"]["decode"]["bytesPerFullToken"]
    return total


def test_patch_step_applies_the_pool_sizing_fix_with_the_planners_numbers(tmp_path: Path) -> None:
    python = _stand_in(tmp_path / "sglang-checkout", fork=False)
    before = _probe(python, "bf16")
    assert before == {"indexer": 132, "total": 7705.45}, "unpatched: fp8 size whatever the dtype"
    proc = _run_step(python, "poolSizingFix")
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "Applied patch sglang/srt/model_executor/pool_configurator.py cleanly" in proc.stderr
    expected = {"fp8": 132, "bf16": 256, "fp4": 68}
    for dtype, indexer in expected.items():
        got = _probe(python, dtype)
        assert got["indexer"] == indexer, dtype
        assert got["total"] == pytest.approx(_planner(dtype), abs=0.01), dtype
    assert _probe(python, "bf16")["total"] - _probe(python, "fp8")["total"] == pytest.approx(651)
    # Applying twice fails (git apply is strict), so a base that already has it is noticed.
    assert _run_step(python, "poolSizingFix").returncode != 0


def test_patch_step_refuses_bf16_index_k_on_a_base_without_it(tmp_path: Path) -> None:
    upstream = _stand_in(tmp_path / "upstream", fork=False)
    proc = _run_step(upstream, "bf16IndexK,poolSizingFix")
    assert proc.returncode != 0
    assert "bf16IndexK is declared but the base has no SGLANG_DSV4_BF16_INDEX_K" in proc.stderr
    fork = _stand_in(tmp_path / "fork", fork=True)
    proc = _run_step(fork, "bf16IndexK,poolSizingFix")
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_patch_step_fails_when_the_patch_does_not_match_the_base(tmp_path: Path) -> None:
    python = _stand_in(tmp_path / "drifted", fork=False)
    module = python / CONFIGURATOR
    module.write_text(module.read_text().replace("quant_block_size = 128", "block = 128"))
    proc = _run_step(python, "poolSizingFix")
    assert proc.returncode != 0
    assert "patch does not apply" in proc.stderr


def test_patch_is_the_only_one_and_targets_the_referenced_upstream_file() -> None:
    patches = sorted(PATCHES.glob("*.patch"))
    assert [p.name for p in patches] == ["0001-dsv4-pool-configurator-bf16-aware-index-k.patch"]
    text = patches[0].read_text()
    target = "python/sglang/srt/model_executor/pool_configurator.py"
    assert f"--- a/{target}" in text and f"+++ b/{target}" in text
    assert "Capability: poolSizingFix" in text
    chart_values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert chart_values["image"]["repository"].endswith("dsv4-operator")
