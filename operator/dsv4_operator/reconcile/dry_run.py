"""The API server's own verdict on the children a spec renders (server-side dry run)."""

from __future__ import annotations

import asyncio

from dsv4_operator.api.spec import DSV4DeploymentSpec
from dsv4_operator.kube.client import KubeClient
from dsv4_operator.kube.errors import Conflict, KubeError, NotFound, refused
from dsv4_operator.kube.objects import Obj
from dsv4_operator.render.children import render_spec


async def refused_children(
    client: KubeClient, name: str, namespace: str, spec: DSV4DeploymentSpec
) -> list[str]:
    """`<Kind> <name>: <the API server's message>` for every child of `spec` the API server
    refuses (schema, defaulting, the validation no schema expresses, admission policies);
    empty when it accepts them all. Other failures (unreachable, RBAC) raise: they say
    nothing about the spec."""
    children = render_spec(name, namespace, spec)
    verdicts = await asyncio.gather(*(_refusal(client, child) for child in children))
    return [v for v in verdicts if v]


async def _refusal(client: KubeClient, child: Obj) -> str | None:
    try:
        await client.dry_run_create(child)
    except Conflict:
        return None  # validated, then found to exist: the object itself is acceptable
    except NotFound:
        return None  # a kind the server does not serve (ServiceMonitor): not the spec's fault
    except KubeError as error:
        if refused(error):
            return f"{child['kind']} {child['metadata']['name']}: {error.message}"
        raise
    return None
