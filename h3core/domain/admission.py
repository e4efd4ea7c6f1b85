"""Admission: may this request become a job? A pure policy over the request alone.

A refused request never becomes a job: the caller gets the reason and the limit instead. The
default admits everything; the capacity model supplies the real policy.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict

from h3core.domain.geometry import Media
from h3core.domain.request import GenerationRequest

CeilingReason = Literal["vram", "quality", "api_limit"]


class Ceiling(BaseModel):
    """The largest frame count admitted for a request's shape, and what sets it."""

    model_config = ConfigDict(frozen=True)

    max_frames: int
    reason: CeilingReason
    verified: bool = True  # False where no measurement backs the limit


class Admit(BaseModel):
    model_config = ConfigDict(frozen=True)

    admitted: Literal[True] = True
    tokens: int | None = None  # the request's sequence length, when the policy computed it


class Refuse(BaseModel):
    model_config = ConfigDict(frozen=True)

    admitted: Literal[False] = False
    detail: str
    ceiling: Ceiling | None = None


Decision = Admit | Refuse


@runtime_checkable
class AdmissionPolicy(Protocol):
    """Decides a request. Must be pure and deterministic: the same request, the same answer."""

    def decide(self, request: GenerationRequest, media: Mapping[str, Media] | None = None) -> Decision:
        """`media`: what is known of the request's uploads (dimensions, duration), by id."""
        ...


class AdmitAll:
    """Admits every valid request. The default until capacity is measured."""

    def decide(self, request: GenerationRequest, media: Mapping[str, Media] | None = None) -> Decision:
        return Admit()
