"""What the playground's pod runner runs for a container: which images it knows, the argv and
environment a kubelet would give the container, and its volumes as host directories.

Known images (anything else is reported as not runnable):

* the operator's image (``.../dsv4-operator:TAG``, built from this tree): the container's
  command (``python -m dsv4_operator.weights``) or its args to the image's entry point
  (``dsv4 run``, ``dsv4 tap``, ``dsv4 selftest``), run from this tree with this Python: REAL;
* any image whose command is ``python3 -m sglang_router.launch_router``: the real router from
  the ``sglang-router`` wheel (pinned in pyproject's test extras), with the rendered argv: REAL;
* any image whose command is ``python3 -m sglang.launch_server``: the engine test double
  (:mod:`dsv4_engine_double`) in the release its StatefulSet names, with the capabilities its
  DSV4Deployment lists: a STAND-IN (no GPU here).

Volumes become directories (a Secret's or ConfigMap's keys as files, an emptyDir, a claim's
hostPath volume); a path under a container's ``mountPath`` in its env or argv is rewritten
to the directory, since the process shares the host's file system.
"""

from __future__ import annotations

import base64
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dsv4_engine_double.process import ENGINE_MODULE, launch_from_statefulset
from dsv4_operator.names import API_VERSION, DEPLOYMENT_LABEL, KIND

ROUTER_MODULE = "sglang_router.launch_router"
OPERATOR_IMAGE = "dsv4-operator"

REAL_OPERATOR = "real: dsv4 from this tree"
REAL_ROUTER = "real: sglang-router (PyPI wheel)"
STAND_IN_ENGINE = "stand-in: the engine test double"


class NotRunnable(Exception):
    """The runner cannot run this container (unknown image, a volume it cannot make yet)."""


class NotYet(Exception):
    """Not runnable yet (its claim is not bound): the runner tries again later."""


@dataclass
class Launch:
    """One container as a host process."""

    container: str
    kind: str
    argv: list[str]
    env: dict[str, str] = field(default_factory=dict)


def _module(command: list[str]) -> str | None:
    if len(command) >= 3 and Path(command[0]).name.startswith("python") and command[1] == "-m":
        return command[2]
    return None


def _repository(image: str) -> str:
    """`registry.example.com/dsv4-operator:0.1.0` -> `dsv4-operator`."""
    last = image.split("@", 1)[0].rsplit("/", 1)[-1]
    return last.split(":", 1)[0]


def classify(container: dict[str, Any]) -> str:
    """Which kind of process runs this container; NotRunnable when none."""
    command = list(container.get("command") or [])
    module = _module(command)
    if module == ROUTER_MODULE:
        return REAL_ROUTER
    if module == ENGINE_MODULE:
        return STAND_IN_ENGINE
    if _repository(container.get("image", "")) == OPERATOR_IMAGE:
        return REAL_OPERATOR
    raise NotRunnable(
        f"image {container.get('image')!r} (command {command[:3]}) is none the playground "
        "runs: the operator's image, sglang's router or sglang's server (the engine double)"
    )


def _secret_data(dyn: Any, kind: str, namespace: str, name: str) -> dict[str, bytes]:
    obj = dyn.resources.get(api_version="v1", kind=kind).get(name=name, namespace=namespace)
    found = obj.to_dict()
    if kind == "Secret":
        return {k: base64.b64decode(v) for k, v in (found.get("data") or {}).items()}
    return {k: v.encode() for k, v in (found.get("data") or {}).items()}


def materialize_volumes(dyn: Any, pod: dict[str, Any], root: Path) -> dict[str, Path]:
    """Each volume of the pod as a host directory, by volume name."""
    namespace = pod["metadata"]["namespace"]
    found: dict[str, Path] = {}
    for volume in pod["spec"].get("volumes") or []:
        name = volume["name"]
        path = root / "volumes" / name
        if "persistentVolumeClaim" in volume:
            claim_name = volume["persistentVolumeClaim"]["claimName"]
            claims = dyn.resources.get(api_version="v1", kind="PersistentVolumeClaim")
            claim = claims.get(name=claim_name, namespace=namespace).to_dict()
            bound = claim["spec"].get("volumeName")
            if not bound or (claim.get("status") or {}).get("phase") != "Bound":
                raise NotYet(f"claim {claim_name} is not bound yet")
            pv = dyn.resources.get(api_version="v1", kind="PersistentVolume").get(name=bound)
            host_path = (pv.to_dict()["spec"].get("hostPath") or {}).get("path")
            if not host_path:
                raise NotRunnable(f"volume {bound} of claim {claim_name} is not a hostPath")
            found[name] = Path(host_path)
            found[name].mkdir(parents=True, exist_ok=True)
            continue
        path.mkdir(parents=True, exist_ok=True)
        source = volume.get("secret") or volume.get("configMap")
        if source is not None:
            kind = "Secret" if "secret" in volume else "ConfigMap"
            data = _secret_data(dyn, kind, namespace, source.get("secretName") or source["name"])
            items = source.get("items") or [{"key": k, "path": k} for k in data]
            for item in items:
                (path / item["path"]).write_bytes(data[item["key"]])
        found[name] = path
    return found


def _resolve_env(dyn: Any, pod: dict[str, Any], container: dict[str, Any]) -> dict[str, str]:
    """The container's env as a kubelet resolves it: values, fieldRefs, Secret/ConfigMap keys."""
    meta, namespace = pod["metadata"], pod["metadata"]["namespace"]
    fields = {
        "metadata.name": meta["name"],
        "metadata.namespace": namespace,
        "spec.nodeName": pod["spec"].get("nodeName", ""),
        "spec.serviceAccountName": pod["spec"].get("serviceAccountName", ""),
    }
    env: dict[str, str] = {}
    for var in container.get("env") or []:
        source = var.get("valueFrom")
        if source is None:
            env[var["name"]] = str(var.get("value", ""))
        elif "fieldRef" in source:
            env[var["name"]] = fields.get(source["fieldRef"]["fieldPath"], "")
        elif "secretKeyRef" in source or "configMapKeyRef" in source:
            kind = "Secret" if "secretKeyRef" in source else "ConfigMap"
            ref = source.get("secretKeyRef") or source["configMapKeyRef"]
            data = _secret_data(dyn, kind, namespace, ref["name"])
            env[var["name"]] = data[ref["key"]].decode()
    return env


def _rewrite(value: str, mounts: list[tuple[str, Path]]) -> str:
    for mount_path, host in mounts:
        if value == mount_path or value.startswith(mount_path + "/"):
            return str(host) + value[len(mount_path) :]
    return value


def _engine(dyn: Any, pod: dict[str, Any]) -> tuple[list[str], dict[str, str]]:
    """The double's argv and env from the pod's StatefulSet and DSV4Deployment."""
    meta = pod["metadata"]
    owner = next(o for o in meta.get("ownerReferences") or [] if o["kind"] == "StatefulSet")
    sets = dyn.resources.get(api_version="apps/v1", kind="StatefulSet")
    statefulset = sets.get(name=owner["name"], namespace=meta["namespace"]).to_dict()
    deployment = (meta.get("labels") or {}).get(DEPLOYMENT_LABEL)
    capabilities: list[str] = []
    if deployment:
        dsv4 = dyn.resources.get(api_version=API_VERSION, kind=KIND)
        spec = dsv4.get(name=deployment, namespace=meta["namespace"]).to_dict()["spec"]
        capabilities = list(spec["engine"].get("capabilities") or [])
    return launch_from_statefulset(statefulset, capabilities)


def launches(
    dyn: Any, pod: dict[str, Any], volumes: dict[str, Path], base_env: dict[str, str]
) -> list[Launch]:
    """Every container of the pod as a host process; NotRunnable if one cannot be."""
    found = []
    for container in pod["spec"]["containers"]:
        kind = classify(container)
        mounts = sorted(
            ((m["mountPath"], volumes[m["name"]]) for m in container.get("volumeMounts") or []),
            key=lambda m: -len(m[0]),
        )
        # Only what the pod spec says is rewritten: the runner's own paths stay as they are.
        env = {k: _rewrite(v, mounts) for k, v in _resolve_env(dyn, pod, container).items()}
        command = [_rewrite(a, mounts) for a in container.get("command") or []]
        args = [_rewrite(a, mounts) for a in container.get("args") or []]
        if kind == STAND_IN_ENGINE:
            engine_args, double_env = _engine(dyn, pod)
            env.update(double_env)
            argv = [sys.executable, "-m", "dsv4_engine_double", *engine_args]
        elif command:
            argv = [sys.executable, *command[1:], *args]
        else:  # the operator image's entry point: `dsv4`
            argv = [sys.executable, "-m", "dsv4_operator.cli", *args]
        found.append(Launch(container["name"], kind, argv, {**base_env, **env}))
    return found
