"""The open-files limit the operator raises at start: every canary session holds a socket.

A canary run holds one connection per session (9 per decode DP rank by default, up to 64),
and DSV4_GUARD_CANARIES_AT_ONCE runs may be in flight across all deployments. containerd 2.x
no longer sets LimitNOFILE (containerd/containerd#8924), so containers get systemd's 1024
soft / 524288 hard (moby/moby#51485); at 1024 connections would fail with EMFILE, and the
guard would count its own limit as the engines' errors. A process may raise its soft limit
up to the hard one unprivileged, as Go's runtime does at start since 1.19.
"""

from __future__ import annotations

import logging
import resource

log = logging.getLogger(__name__)


def raise_open_files_limit() -> int:
    """The soft RLIMIT_NOFILE raised to the hard one; the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or soft == resource.RLIM_INFINITY or soft >= hard:
        return soft  # unlimited soft is already the most; an unlimited hard is left alone
    try:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    except (ValueError, OSError) as error:
        log.warning("open files: cannot raise the soft limit %d to %d: %s", soft, hard, error)
        return soft
    log.info("open files: soft limit raised from %d to %d (the hard limit)", soft, hard)
    return hard
