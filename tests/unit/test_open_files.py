"""The operator raises its soft open-files limit to the hard one at start."""

from __future__ import annotations

import resource

from dsv4_operator.runtime.open_files import raise_open_files_limit


def test_the_soft_limit_is_raised_to_the_hard_one() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    low = min(256, soft)
    assert hard == resource.RLIM_INFINITY or hard > low  # else there is nothing to raise
    resource.setrlimit(resource.RLIMIT_NOFILE, (low, hard))
    try:
        raised = raise_open_files_limit()
        now = resource.getrlimit(resource.RLIMIT_NOFILE)[0]
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))  # as the runner had it
    if hard == resource.RLIM_INFINITY:  # left alone: Linux caps NOFILE below infinity
        assert raised == now == low
    else:
        assert raised == now == hard
