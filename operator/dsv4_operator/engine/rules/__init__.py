"""The rule catalogue: each rule is a pure check on the spec and its plan, registered with its
metadata (id, severity, the releases it applies to, its public source) right above the check.

One module per rule family; catalogue.py holds the machinery. Importing the package registers
every family, so CATALOGUE is whole (in id order) wherever it is read.

Sources cite sglang issue/PR numbers and docs/engine-notes.md sections, which hold the evidence.
"""

from __future__ import annotations

from dsv4_operator.engine.rules import (
    index_k,
    memory,
    model,
    multinode,
    overlap,
    pairing,
    passthrough,
)
from dsv4_operator.engine.rules.catalogue import (
    CATALOGUE,
    RULES_BY_ID,
    Hit,
    Rule,
    RuleContext,
    context,
    run_rules,
)

FAMILIES = (index_k, overlap, memory, pairing, passthrough, model, multinode)

__all__ = [
    "CATALOGUE",
    "FAMILIES",
    "RULES_BY_ID",
    "Hit",
    "Rule",
    "RuleContext",
    "context",
    "run_rules",
]
