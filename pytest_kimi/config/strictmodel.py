"""The base of every cluster-file model: strict, closed and frozen.

One base so that every section of the file (:mod:`pytest_kimi.config.models` and the section
modules it is built from) validates alike: the YAML's own types, no unknown keys.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict


class StrictModel(BaseModel):
    """Strict: no coercion ("8" is not 8), unknown keys rejected, values frozen."""

    model_config = ConfigDict(strict=True, extra="forbid", frozen=True)
