"""Request bodies validated with each model's own strictness.

Litestar's Pydantic plugin calls `model_validate(value, strict=False)` by default, which
overrides a model's `strict=True`: `"frames": "124"` would be coerced instead of refused.
`strict=None` (passed through to pydantic) means "as the model says".
"""

from __future__ import annotations

from litestar.plugins.pydantic import PydanticInitPlugin


class ModelStrictness(PydanticInitPlugin):
    """Litestar's Pydantic plugin, validating each body with its model's own strictness."""

    def __init__(self) -> None:
        super().__init__(validate_strict=None)  # type: ignore[arg-type]  # None: the model's own config
