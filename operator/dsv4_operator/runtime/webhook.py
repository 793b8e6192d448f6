"""The admission webhook's HTTPS server: kopf's, hardened, with its certificate."""

from __future__ import annotations

import atexit
import shutil
import tempfile
from pathlib import Path
from typing import Any

import aiohttp.web
import kopf

from dsv4_operator.runtime.webhook_certs import self_signed
from dsv4_operator.settings import OperatorSettings

# kopf serves the handler at /<id>; the chart's ValidatingWebhookConfiguration points there.
ADMISSION_HANDLER_ID = "rules"


class AdmissionServer(kopf.WebhookServer):
    """kopf's webhook server, answering 400 with the reason to a body Python's JSON reader
    refuses with a ValueError that is not a JSONDecodeError (an integer of more than 4,300
    digits), where kopf's answers 500 and logs a traceback. Handlers' own errors never get
    here: kopf turns them into the review's verdict."""

    @staticmethod
    async def _serve(fn: Any, request: aiohttp.web.Request) -> aiohttp.web.Response:
        try:
            return await kopf.WebhookServer._serve(fn, request)
        except ValueError as error:
            why = str(error).split(";")[0]  # CPython's advice on its own limit is not the user's
            raise aiohttp.web.HTTPBadRequest(
                reason=f"the AdmissionReview is not JSON this webhook reads: {why}"
            ) from error


def webhook_server(op: OperatorSettings) -> AdmissionServer:
    """The server of the settings: the chart's certificate, or a self-signed one locally."""
    cert_dir = op.webhook_cert_dir
    if cert_dir is None:  # local runs: a self-signed cert for the address the API server dials
        cert_dir = Path(tempfile.mkdtemp(prefix="dsv4-webhook-"))
        # The key is this process's alone: gone when it exits (kopf re-reads the files while it
        # serves). Before, every local start left a key behind in the temporary directory.
        atexit.register(shutil.rmtree, cert_dir, ignore_errors=True)
        self_signed(cert_dir, [op.webhook_url_host or "localhost", "127.0.0.1"])
    crt, key = cert_dir / "tls.crt", cert_dir / "tls.key"
    return AdmissionServer(
        addr=op.listen_host,
        port=op.webhook_port,
        host=op.webhook_url_host,
        certfile=crt,
        pkeyfile=key,
        cafile=crt,
    )
