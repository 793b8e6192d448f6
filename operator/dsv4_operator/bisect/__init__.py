"""Culprit bisection: the configuration delta, the ddmin search and probe outcomes (pure)."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict
from pydantic.alias_generators import to_camel


class BisectModel(BaseModel):
    """Base of the bisection's models: camelCase in JSON (they live in status), either
    spelling accepted when read back."""

    model_config = ConfigDict(
        alias_generator=to_camel, populate_by_name=True, serialize_by_alias=True
    )
