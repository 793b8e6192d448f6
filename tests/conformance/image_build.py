"""The engine image's patch step, run here: a copy of a release's wheel modules, and the
Dockerfile's RUN steps (version check, patches in order, marker checks) with bash against it."""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

from .release_env import REPO, parse_tool_calls, release_python

ENGINE = REPO / "images" / "engine"
CONFIGURATOR = Path("sglang") / "srt" / "model_executor" / "pool_configurator.py"
TOOL_PARSER = Path("sglang") / "srt" / "function_call" / "deepseekv32_detector.py"


def patches(version: str, root: Path = ENGINE / "patches") -> list[Path]:
    """The release's patches, in the order the Dockerfile applies them."""
    return sorted((root / version).glob("*.patch"))


def patched_modules(version: str) -> list[Path]:
    """The wheel modules the release's patches change (not the files they add), relative to
    site-packages."""
    found: set[Path] = set()
    for patch in patches(version):
        for line in patch.read_text().splitlines():
            if line.startswith("--- a/python/"):
                found.add(Path(line.removeprefix("--- a/python/")))
    return sorted(found)


@functools.cache
def wheel_root(version: str) -> Path:
    """The site-packages directory holding the release's installed `sglang` (found, not
    imported: importing it costs seconds of CPU)."""
    out = subprocess.run(
        [
            release_python(version),
            "-c",
            "import importlib.util as u, os; print(os.path.dirname(u.find_spec('sglang').origin))",
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(out).parent


def _dist_info(site: Path, version: str) -> None:
    info = site / f"sglang-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n")


def site_copy(version: str, root: Path) -> Path:
    """A site-packages holding the wheel's modules the patches change (and its version)."""
    site = root / "site-packages"
    wheel = wheel_root(version)
    for module in patched_modules(version):
        target = site / module
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(wheel / module, target)
        package = target.parent
        while package != site:
            (package / "__init__.py").touch()
            package = package.parent
    _dist_info(site, version)
    return site


def full_site_copy(version: str, root: Path) -> Path:
    """A site-packages holding a copy of the whole installed `sglang` package (importable)."""
    site = root / "site-packages"
    shutil.copytree(wheel_root(version) / "sglang", site / "sglang", symlinks=True)
    _dist_info(site, version)
    return site


def patch_steps(patch_root: Path = ENGINE / "patches") -> str:
    """The Dockerfile's RUN steps that check the version and apply the patches."""
    text = (ENGINE / "Dockerfile").read_text()
    text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    runs = [m.replace("\\\n", " ") for m in re.findall(r"^RUN (.*?)(?=^\S|\Z)", text, re.S | re.M)]
    return " && ".join(f"( {r.strip()} )" for r in runs).replace(
        "/opt/dsv4/patches", str(patch_root)
    )


def run_steps(
    site: Path, version: str, capabilities: str, patch_root: Path = ENGINE / "patches"
) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "PYTHONPATH": str(site),
        "SGLANG_VERSION": version,
        "CAPABILITIES": capabilities,
    }
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", patch_steps(patch_root)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )


def tool_call_parses(
    version: str, cases: list[dict[str, Any]], root: Path
) -> tuple[dict[str, Any], dict[str, Any]]:
    """tool_call_check.py's answers for `cases` on the release's wheel, and on a copy of it (in
    `root`) that the image's patch step patched with toolCallDropCounter."""
    site = full_site_copy(version, root)
    built = run_steps(site, version, "poolSizingFix,toolCallDropCounter")
    assert built.returncode == 0, built.stdout + built.stderr
    return parse_tool_calls(version, cases, None), parse_tool_calls(version, cases, site)
