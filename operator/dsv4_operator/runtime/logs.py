"""The operator's logging: kopf's format, quiet per-request loggers, admission denials at INFO."""

from __future__ import annotations

import logging

import kopf

from dsv4_operator.runtime.webhook import ADMISSION_HANDLER_ID
from dsv4_operator.settings import OperatorSettings


class AdmissionDenials(logging.Filter):
    """kopf logs every refused admission as an ERROR ("Webhook 'rules' failed permanently:
    ..."); refusing an unsafe spec is the webhook doing its job, so it is logged at INFO as
    `admission denied: <why>`. Other errors pass unchanged."""

    PREFIX = f"Webhook {ADMISSION_HANDLER_ID!r} failed permanently: "

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        if record.levelno == logging.ERROR and message.startswith(self.PREFIX):
            record.levelno, record.levelname = logging.INFO, "INFO"
            record.msg, record.args = f"admission denied: {message[len(self.PREFIX) :]}", None
        return True


def configure_logging(op: OperatorSettings) -> None:
    """kopf's log format and the level of the settings; per-request loggers quieted."""
    kopf.configure(
        verbose=op.log_level == "DEBUG",
        log_format=kopf.LogFormat.JSON if op.log_format == "json" else kopf.LogFormat.FULL,
    )
    logging.getLogger().setLevel(op.log_level)
    # One line per request or per watch event is noise; reconcile decisions are logged.
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("kopf.objects").setLevel(logging.WARNING)
    logging.getLogger("kopf.objects").addFilter(AdmissionDenials())
