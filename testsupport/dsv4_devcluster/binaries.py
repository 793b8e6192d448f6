"""Locate the control-plane binaries: KUBEBUILDER_ASSETS, the build cache, else build them.

Search order (first hit wins):

1. ``$KUBEBUILDER_ASSETS`` (the envtest convention) if it holds every binary we need;
2. the build cache ``${DSV4_K8S_CACHE:-~/.cache/dsv4-operator/k8s}/<K8S_VERSION>/``;
3. run ``tools/build-k8s.sh`` (minutes on first use) and take the directory it prints.

The script is found under ``$DSV4_REPO_ROOT`` or by walking up from this file, which covers a
source checkout and an editable install (``pip install -e .``). Anything else raises
:class:`BinariesUnavailable` with the reason; callers must not turn that into a skip.
"""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

#: Kubernetes release the build script pins; names the cache subdirectory.
K8S_VERSION = "v1.37.2"

#: LeaderWorkerSet release the build script pins (sigs.k8s.io/lws); its CRDs and webhook
#: configurations sit beside the binaries in ``lws-<version>/`` (:meth:`Binaries.lws_manifests`).
LWS_VERSION = "v0.9.0"

CONTROL_PLANE_BINARIES = ("etcd", "kube-apiserver", "kube-controller-manager")
NODE_SIM_BINARIES = ("kube-scheduler", "kwok")
#: Started only by ``ControlPlane(with_lws=True)`` (multi-node roles).
LWS_BINARIES = ("lws-controller-manager",)
ALL_BINARIES = CONTROL_PLANE_BINARIES + NODE_SIM_BINARIES + LWS_BINARIES

BUILD_SCRIPT = Path("tools") / "build-k8s.sh"


class BinariesUnavailable(RuntimeError):
    """The binaries are neither present nor buildable; the message says why."""


@dataclass(frozen=True)
class Binaries:
    """Absolute paths of the control-plane executables."""

    directory: Path

    def path(self, name: str) -> Path:
        """Path of one executable (``etcd``, ``kube-apiserver``, ...)."""
        return self.directory / name

    def lws_manifests(self) -> Path:
        """``lws-<LWS_VERSION>/`` beside the binaries: ``crd/*.yaml`` and ``webhook/*.yaml``
        (manifests and their patches) of the LWS release the manager was built from."""
        return self.directory / f"lws-{os.environ.get('DSV4_LWS_VERSION') or LWS_VERSION}"

    def missing(self, names: tuple[str, ...] = ALL_BINARIES) -> list[str]:
        """Names among ``names`` that are absent or not executable (the LWS manager also
        when its manifests are missing)."""
        out = [n for n in names if not os.access(self.directory / n, os.X_OK)]
        # The build script writes the directory at once; its last file means all are there.
        manifests = self.lws_manifests() / "webhook" / "validating-patch.yaml"
        if "lws-controller-manager" in names and "lws-controller-manager" not in out:
            out += [] if manifests.is_file() else ["lws-controller-manager"]
        return out

    def require(self, names: tuple[str, ...] = ALL_BINARIES) -> Binaries:
        """Return self, or raise :class:`BinariesUnavailable` naming what is missing."""
        missing = self.missing(names)
        if missing:
            raise BinariesUnavailable(f"{self.directory} lacks {missing}")
        return self


def cache_dir() -> Path:
    """Directory where ``tools/build-k8s.sh`` puts binaries for :data:`K8S_VERSION`
    (or ``$DSV4_K8S_VERSION``, the script's override)."""
    root = os.environ.get("DSV4_K8S_CACHE") or str(Path.home() / ".cache/dsv4-operator/k8s")
    return Path(root) / (os.environ.get("DSV4_K8S_VERSION") or K8S_VERSION)


def find_build_script() -> Path | None:
    """``tools/build-k8s.sh`` of the repository this package lives in, if any."""
    candidates: list[Path] = []
    env_root = os.environ.get("DSV4_REPO_ROOT")
    if env_root:
        candidates.append(Path(env_root))
    candidates.extend(Path(__file__).resolve().parents)
    for root in candidates:
        script = root / BUILD_SCRIPT
        if script.is_file():
            return script
    return None


def locate(names: tuple[str, ...] = ALL_BINARIES, *, build: bool = True) -> Binaries:
    """Return a directory holding ``names``, building them with the script if allowed."""
    assets = os.environ.get("KUBEBUILDER_ASSETS")
    if assets:
        found = Binaries(Path(assets).resolve())
        if not found.missing(names):
            return found
    cached = Binaries(cache_dir())
    if not cached.missing(names):
        return cached
    if not build:
        raise BinariesUnavailable(
            f"missing {cached.missing(names)} in {cached.directory} and building is disabled"
        )
    return Binaries(run_build_script()).require(names)


def run_build_script() -> Path:
    """Run ``tools/build-k8s.sh`` (progress goes to stderr) and return the directory it prints."""
    script = find_build_script()
    if script is None:
        raise BinariesUnavailable(
            f"{BUILD_SCRIPT} not found (set DSV4_REPO_ROOT to the repository checkout, "
            "or KUBEBUILDER_ASSETS to a directory holding the binaries)"
        )
    print(f"devcluster: building Kubernetes binaries with {script}", file=sys.stderr, flush=True)
    proc = subprocess.run(
        ["bash", str(script)], stdout=subprocess.PIPE, stderr=None, text=True, check=False
    )
    if proc.returncode != 0:
        raise BinariesUnavailable(f"{script} failed with exit code {proc.returncode}")
    lines = proc.stdout.strip().splitlines()
    if not lines:
        raise BinariesUnavailable(f"{script} printed no output directory")
    return Path(lines[-1])
