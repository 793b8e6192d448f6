"""Playing the kubelet for the weights download Job: its container, run here as a process.

kwok marks the Job's pod Running but runs nothing. The test runs the container's own command
(`python -m dsv4_operator.weights`) locally with the env the operator rendered (values,
`fieldRef` namespace, `secretKeyRef` read from the Secret), a token of the Job's own service
account (so the progress annotation goes through the Role the operator created, nothing
more), and a directory standing for the claim; then reports the pod ended with the exit code.
"""

from __future__ import annotations

import base64
import subprocess
import sys
from pathlib import Path
from typing import Any

from dsv4_devcluster import ControlPlane, report_pod_exited, wait_for
from dsv4_operator.kube.objects import Obj

from .cluster_support import service_account_kubeconfig


def token_secret(dyn: Any, namespace: str, token: str, name: str = "hf-token") -> None:
    """The Hub token's Secret, with the key `token` the spec's tokenSecret defaults to."""
    dyn.resources.get(api_version="v1", kind="Secret").create(
        namespace=namespace,
        body={
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": name},
            "stringData": {"token": token},
        },
    )


def container_env(dyn: Any, namespace: str, container: Obj) -> dict[str, str]:
    """The container's env as the kubelet resolves it (the kinds the Job uses)."""
    env: dict[str, str] = {}
    secrets = dyn.resources.get(api_version="v1", kind="Secret")
    for item in container.get("env", []):
        source = item.get("valueFrom")
        if source is None:
            env[item["name"]] = item.get("value", "")
        elif "fieldRef" in source:
            assert source["fieldRef"]["fieldPath"] == "metadata.namespace"
            env[item["name"]] = namespace
        else:
            ref = source["secretKeyRef"]
            data = secrets.get(name=ref["name"], namespace=namespace).to_dict()["data"]
            env[item["name"]] = base64.b64decode(data[ref["key"]]).decode()
    return env


def job_pod(dyn: Any, namespace: str, job: str, exclude: set[str] | None = None) -> Obj:
    """The Job's Running pod (not one of `exclude`: an earlier attempt)."""
    pods = dyn.resources.get(api_version="v1", kind="Pod")

    def running() -> Obj | None:
        for pod in pods.get(namespace=namespace, label_selector=f"job-name={job}").to_dict()[
            "items"
        ]:
            name = pod["metadata"]["name"]
            if (pod.get("status") or {}).get("phase") == "Running" and name not in (
                exclude or set()
            ):
                found: Obj = pod
                return found
        return None

    return wait_for(f"a Running pod of Job {job}", running, timeout=90)


class JobContainer:
    """One attempt of the download Job's container, run locally."""

    def __init__(
        self, cp: ControlPlane, namespace: str, job: Obj, claim_dir: Path, work: Path
    ) -> None:
        dyn = cp.dynamic_client()
        self.dyn, self.namespace = dyn, namespace
        self.job_name = job["metadata"]["name"]
        pod_spec = job["spec"]["template"]["spec"]
        self.container = pod_spec["containers"][0]
        env = container_env(dyn, namespace, self.container)
        mount = next(m for m in self.container["volumeMounts"] if m["name"] == "models")
        assert env["HF_HOME"] == mount["mountPath"]
        self.termination_log = work / "termination-log"
        kubeconfig = service_account_kubeconfig(
            cp, namespace, pod_spec["serviceAccountName"], work / "sa.kubeconfig"
        )
        env.update(
            HF_HOME=str(claim_dir),  # the claim, mounted
            KUBECONFIG=str(kubeconfig),
            DSV4_TERMINATION_LOG=str(self.termination_log),
            DSV4_WEIGHTS_INTERVAL="0.5",
            PATH="/usr/bin:/bin",
        )
        self.env = env
        self.command = [sys.executable if self.container["command"][0] == "python" else ""]
        self.command += self.container["command"][1:]
        self.log = work / "download.log"
        self.process: subprocess.Popen[bytes] | None = None
        self.pod: Obj | None = None

    def start(self, exclude: set[str] | None = None) -> JobContainer:
        self.pod = job_pod(self.dyn, self.namespace, self.job_name, exclude)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                self.command, env=self.env, stdout=out, stderr=subprocess.STDOUT
            )
        return self

    def finish(self, timeout: float = 120) -> int:
        """Wait for the process; report the pod ended with its exit code."""
        assert self.process is not None and self.pod is not None
        code = self.process.wait(timeout=timeout)
        return self.report(code)

    def kill(self) -> int:
        """The pod dies (SIGKILL, exit 137)."""
        assert self.process is not None
        self.process.kill()
        self.process.wait()
        return self.report(137)

    def report(self, code: int) -> int:
        assert self.pod is not None
        message = self.termination_log.read_text() if self.termination_log.is_file() else ""
        report_pod_exited(
            self.dyn,
            self.namespace,
            self.pod["metadata"]["name"],
            self.container["name"],
            code,
            message,
        )
        return code
