"""The REST client with an exec plugin kubeconfig: the plugin (a real process) is run for a
credential, and again after a 401. The other credential tests: tests/unit/test_kube_auth.py."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import httpx
import pytest
import yaml

from dsv4_operator.kube.client import (
    ConfigurationCredentials,
    KubeClient,
    http_client_for,
    load_credentials,
)
from dsv4_operator.kube.errors import KubeError
from dsv4_operator.kube.resources import POD
from tests.support.auth_server import SERVER, AuthServer


def exec_kubeconfig(tmp_path: Path) -> tuple[Path, Callable[[], int]]:
    """A kubeconfig whose user is an exec plugin handing out `exec-1`, `exec-2`, ..."""
    counter = tmp_path / "runs"
    plugin = tmp_path / "plugin.py"
    plugin.write_text(
        "import json, pathlib, sys\n"
        f"runs = pathlib.Path({str(counter)!r})\n"
        "n = int(runs.read_text()) + 1 if runs.exists() else 1\n"
        "runs.write_text(str(n))\n"
        "json.dump({'apiVersion': 'client.authentication.k8s.io/v1beta1',\n"
        "           'kind': 'ExecCredential', 'status': {'token': f'exec-{n}'}}, sys.stdout)\n"
    )
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "c", "cluster": {"server": SERVER, "insecure-skip-tls-verify": True}}
        ],
        "users": [
            {
                "name": "u",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1beta1",
                        "command": sys.executable,
                        "args": [str(plugin)],
                    }
                },
            }
        ],
        "contexts": [{"name": "x", "context": {"cluster": "c", "user": "u"}}],
        "current-context": "x",
    }
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    return path, lambda: int(counter.read_text())


async def test_an_exec_plugin_kubeconfig_is_run_again_on_a_401(tmp_path: Path) -> None:
    kubeconfig, runs = exec_kubeconfig(tmp_path)
    cfg, credentials = load_credentials(str(kubeconfig))
    assert isinstance(credentials, ConfigurationCredentials) and runs() == 1
    server = AuthServer("exec-2")  # the first credential has been revoked
    http = http_client_for(cfg, credentials=credentials, transport=httpx.MockTransport(server))
    client = KubeClient(http)
    assert await client.get(POD, "ns", "p") is not None
    assert runs() == 2 and server.seen == ["Bearer exec-1", "Bearer exec-2"]
    server.valid = set()
    with pytest.raises(KubeError) as info:
        await client.get(POD, "ns", "p")
    await client.close()
    assert info.value.status == 401 and runs() == 3
    assert server.seen[-2:] == ["Bearer exec-2", "Bearer exec-3"]
