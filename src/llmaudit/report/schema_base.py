"""The pydantic building blocks of report.json's typed models (`llmaudit.report.models`): numbers and intervals as
written, and the section base class that keeps the keys it does not name and the order it read them in."""

from __future__ import annotations

from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, PrivateAttr, ValidationInfo, model_serializer, model_validator

from llmaudit.common.schema import in_read_order

Num = int | float | None
"""A number or null (report.json writes NaN and +-inf as null); an int stays an int."""

Interval = list[Num] | None
"""A 95% interval [low, high], or null."""

CriterionStatus = Literal["PASS", "FAIL", "INCONCLUSIVE", "NOT MEASURED", "DISABLED"]
"""The status of one checklist criterion: a release verdict (`llmaudit.analyze.decision.models.Verdict`), or
DISABLED (the criterion is off)."""


def schema_required(schema: dict[str, Any], cls: type[BaseModel]) -> None:
    """Mark required in a model's generated JSON Schema every field but its `optional_keys`.

    Args:
        schema: the schema pydantic generated for `cls`, changed in place.
        cls: the model.
    """
    optional = getattr(cls, "optional_keys", frozenset())
    schema["required"] = [
        (f.alias or name) for name, f in cls.model_fields.items() if name not in optional and not f.exclude
    ]


class _Open(BaseModel):
    """A section of report.json: extra keys kept, the key order read kept when written again.

    optional_keys: the fields the current builder may leave out; every other field must be present when
    validated with context {"current": True} (and is required in the generated JSON Schema)."""

    model_config = ConfigDict(extra="allow", json_schema_extra=schema_required, populate_by_name=True)
    optional_keys: ClassVar[frozenset[str]] = frozenset()
    _order: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _read(cls, data: Any, handler: Any, info: ValidationInfo) -> Any:
        if isinstance(data, dict) and info.context and info.context.get("current"):
            names = {(f.alias or n) for n, f in cls.model_fields.items() if n not in cls.optional_keys}
            missing = sorted(names - set(data))
            if missing:
                raise ValueError(f"{cls.__name__} lacks {', '.join(missing)}")
        model = handler(data)
        if isinstance(data, dict):
            model._order = tuple(data)
        return model

    @model_serializer(mode="wrap")
    def _write(self, handler: Any) -> dict[str, Any]:
        return in_read_order(handler(self), self._order)


class _Closed(_Open):
    model_config = ConfigDict(extra="forbid", json_schema_extra=schema_required)


class _Recorded(_Open):
    """A block the analysis recorded (experiment, recipe): every key optional."""

    @classmethod
    def __pydantic_init_subclass__(cls, **kwargs: Any) -> None:
        super().__pydantic_init_subclass__(**kwargs)
        cls.optional_keys = frozenset(cls.model_fields)


class Stat(_Open):
    """An estimate over runs: mean, interval, token-level standard error."""

    optional_keys = frozenset({"token_se"})
    mean: Num = None
    ci: Interval = None
    token_se: Num = None
