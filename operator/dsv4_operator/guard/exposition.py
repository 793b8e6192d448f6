"""Cutting a Prometheus text page down to the families a reader counts, before it is parsed."""

from __future__ import annotations

import re
from collections.abc import Iterable


def family_filter(names: Iterable[str]) -> re.Pattern[str]:
    """A pattern for `only_families`: the lines of the families whose names start with one of
    `names` (their samples, `_total`, `_bucket` and the like included) and their # HELP and
    # TYPE lines."""
    alternatives = "|".join(re.escape(name) for name in sorted(names))
    return re.compile(rf"^(?:# (?:HELP|TYPE) )?(?:{alternatives}).*$", re.MULTILINE)


def only_families(text: str, wanted: re.Pattern[str]) -> str:
    """The lines of `text` that `wanted` (family_filter) keeps, in their order.

    The guard reads a few counters of pages it scrapes every few seconds (an engine's page
    has dozens of families, histograms among them); parsing every line was the largest part
    of an idle operator's CPU. What the parser makes of the kept lines is what it makes of
    the whole page for those families: a family's lines all start with its name."""
    return "\n".join(wanted.findall(text)) + "\n"
