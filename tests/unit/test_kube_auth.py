"""The REST client's credentials: a rotated token file is picked up, a 401 logs in once again.

`httpx.MockTransport` stands for the API server's authentication layer: it accepts the tokens
it is told are valid and answers 401 Unauthorized to anything else.
"""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import httpx
import pytest

from dsv4_operator.kube.client import (
    KubeAuth,
    TokenFile,
)
from dsv4_operator.kube.errors import KubeError
from dsv4_operator.kube.resources import POD
from tests.support.auth_server import SERVER, AuthServer


def projected_token(root: Path, token: str, generation: int) -> Path:
    """Write `token` the way the kubelet does: a new dir, then `..data` swapped to it."""
    data = root / f"..{generation}"
    data.mkdir()
    (data / "token").write_text(token)
    link = root / "..data_tmp"
    link.symlink_to(data.name)
    link.replace(root / "..data")
    path = root / "token"
    if not path.is_symlink():
        path.symlink_to("..data/token")
    return path


async def test_a_token_file_rotated_under_a_running_client_is_used_on_the_next_request(
    tmp_path: Path,
) -> None:
    server = AuthServer("first", "second")
    path = projected_token(tmp_path, "first", 1)
    client = server.client(KubeAuth(TokenFile(path)))
    assert await client.get(POD, "ns", "p") is not None
    projected_token(tmp_path, "second", 2)
    server.valid.discard("first")  # the old token is revoked: only the new one works
    assert await client.get(POD, "ns", "p") is not None
    await client.close()
    assert server.seen == ["Bearer first", "Bearer second"]


async def test_a_token_file_rewritten_in_place_is_read_again(tmp_path: Path) -> None:
    server = AuthServer("token-a", "token-b")
    path = tmp_path / "token"
    path.write_text("token-a\n")
    client = server.client(KubeAuth(TokenFile(path)))
    await client.get(POD, "ns", "p")
    path.write_text("token-b\n")
    os.utime(path, ns=(1, 1))  # a different mtime even on a coarse clock
    await client.get(POD, "ns", "p")
    await client.close()
    assert server.seen == ["Bearer token-a", "Bearer token-b"]


class Login:
    """Credentials that hand out `login-1`, `login-2`, ... one per (re-)login."""

    def __init__(self) -> None:
        self.logins = 1

    def header(self) -> str | None:
        return f"Bearer login-{self.logins}"

    def relogin(self) -> None:
        self.logins += 1


async def test_a_401_is_followed_by_one_relogin_and_the_retry_succeeds() -> None:
    server, login = AuthServer("login-2"), Login()
    client = server.client(KubeAuth(login))
    assert await client.get(POD, "ns", "p") == {"kind": "Pod", "metadata": {"name": "p"}}
    await client.close()
    assert server.seen == ["Bearer login-1", "Bearer login-2"] and login.logins == 2


async def test_a_second_401_raises_a_kube_error_401_after_one_relogin() -> None:
    server, login = AuthServer(), Login()
    client = server.client(KubeAuth(login))
    with pytest.raises(KubeError) as info:
        await client.get(POD, "ns", "p")
    await client.close()
    assert info.value.status == 401 and info.value.reason == "Unauthorized"
    assert server.seen == ["Bearer login-1", "Bearer login-2"] and login.logins == 2


async def test_requests_that_fail_together_log_in_once() -> None:
    server, login = AuthServer("login-2"), Login()
    client = server.client(KubeAuth(login))
    results = await asyncio.gather(*(client.get(POD, "ns", f"p{i}") for i in range(5)))
    await client.close()
    assert all(r is not None for r in results) and login.logins == 2


def test_the_sync_flow_also_logs_in_once_on_a_401() -> None:
    server, login = AuthServer("login-2"), Login()
    with httpx.Client(transport=httpx.MockTransport(server), auth=KubeAuth(login)) as http:
        assert http.get(f"{SERVER}/api/v1/pods").status_code == 200
    assert login.logins == 2
