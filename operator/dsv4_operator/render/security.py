"""Pod and container security settings shared by every pod the operator renders.

They pass the Pod Security `baseline` profile (and the seccomp and privilege-escalation
parts of `restricted`); docs/security.md#pod-security lists what `restricted` needs beyond
them. The pods never talk to the Kubernetes API, so no service-account token is mounted.
"""

from __future__ import annotations

from dsv4_operator.render.context import Manifest


def pod_security() -> Manifest:
    """Fields of a PodSpec: no API token, the container runtime's default seccomp profile."""
    return {
        "automountServiceAccountToken": False,
        "securityContext": {"seccompProfile": {"type": "RuntimeDefault"}},
    }


def container_security() -> Manifest:
    """A container's securityContext: no privilege escalation (setuid binaries, ptrace)."""
    return {"allowPrivilegeEscalation": False}
