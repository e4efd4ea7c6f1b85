"""The OpenAPI document says exactly what the server accepts and answers.

Litestar builds its component schemas from the fields' types and drops what pydantic enforces
beyond them: `extra="forbid"` (no `additionalProperties: false`), a bound of 0 (`ge=0` is falsy),
an integer bound beyond a float's precision (2**63 - 1 printed as 9.223372036854776e18). Every
component that is one of our pydantic models is therefore replaced by pydantic's own JSON Schema
of it, which is what validates the request or built the response.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from litestar.openapi.spec import OpenAPI, OpenAPIMediaType, OpenAPIResponse, Operation
from litestar.openapi.spec.base import BaseSchemaObject
from pydantic import BaseModel

_REF = "#/components/schemas/{model}"


@dataclass
class RawSchema(BaseSchemaObject):
    """A JSON Schema written as it is into the document."""

    schema: dict[str, Any] = field(default_factory=dict)

    def to_schema(self) -> dict[str, Any]:
        """The schema, as it was given."""
        return self.schema


def _models() -> dict[str, list[type[BaseModel]]]:
    """Our pydantic models by class name (a name two of them share is left to Litestar)."""
    found: dict[str, list[type[BaseModel]]] = {}
    stack: list[type[BaseModel]] = [BaseModel]
    seen: set[type] = set()
    while stack:
        for sub in stack.pop().__subclasses__():
            if sub in seen:
                continue
            seen.add(sub)
            stack.append(sub)
            if sub.__module__.startswith("h3core."):
                found.setdefault(sub.__name__, []).append(sub)
    return found


def exact_components(openapi: OpenAPI) -> None:
    """Replace each component Litestar made for one of our models by pydantic's schema of it."""
    if openapi.components is None or not openapi.components.schemas:
        return
    schemas = openapi.components.schemas
    models = _models()
    for name in list(schemas):
        candidates = models.get(name, [])
        if len(candidates) != 1:
            continue
        schema = candidates[0].model_json_schema(ref_template=_REF, mode="validation")
        for def_name, definition in schema.pop("$defs", {}).items():
            schemas[def_name] = RawSchema(definition)  # type: ignore[assignment]
        schemas[name] = RawSchema(schema)  # type: ignore[assignment]


def add_component(openapi: OpenAPI, model: type[BaseModel]) -> dict[str, Any]:
    """Put pydantic's schema of `model` (and of the models it uses) among the document's
    components; return the schema, to refine, and the reference to it."""
    assert openapi.components is not None and openapi.components.schemas is not None
    schemas = openapi.components.schemas
    schema = model.model_json_schema(ref_template=_REF, mode="validation")
    for def_name, definition in schema.pop("$defs", {}).items():
        schemas[def_name] = RawSchema(definition)  # type: ignore[assignment]
    schemas[model.__name__] = RawSchema(schema)  # type: ignore[assignment]
    return schema


def ref(model: type[BaseModel]) -> dict[str, str]:
    """A reference to `model`'s schema among the document's components."""
    return {"$ref": _REF.format(model=model.__name__)}


_BINARY = RawSchema({"type": "string", "format": "binary"})


def file_responses(openapi: OpenAPI, path: str, method: str, media_types: Mapping[str, str]) -> None:
    """A route that sends a file: 200 for the whole of it and 206 for the byte range a Range asks,
    each in every media type it may have (`media_types`: the type and when it is sent)."""
    assert openapi.paths is not None
    operation: Operation = getattr(openapi.paths[path], method)
    kinds = "; ".join(f"{t}: {when}" for t, when in media_types.items())
    # RawSchema: written by `to_schema`, as the Schema that Litestar's annotation asks for is.
    content = {t: OpenAPIMediaType(schema=_BINARY) for t in media_types}  # type: ignore[arg-type]
    assert operation.responses is not None
    operation.responses["200"] = OpenAPIResponse(description=f"The whole file ({kinds})", content=content)
    operation.responses["206"] = OpenAPIResponse(description="The byte range a Range header asked for", content=content)
    operation.responses = dict(sorted(operation.responses.items()))
