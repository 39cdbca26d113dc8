"""The base of every block of the typed analysis result (`ResultBlock`) and how it records numbers (`Num`).

Every block keeps the keys it does not name (a later analysis may add some) and, written again, holds exactly the
keys it read, in the order it read them: results/result.json read back and written again is the same file.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, PrivateAttr, model_serializer, model_validator

from llmaudit.common.schema import in_read_order

Num = float | int | None
"""A number as the analysis recorded it (NaN where undefined), or None; an int stays an int."""

Interval = list[Num] | None
"""An interval [low, high] as a list, or None."""


class ResultBlock(BaseModel):
    """A block of the analysis result: the keys it names typed, the others kept; written back key for key."""

    model_config = ConfigDict(extra="allow", populate_by_name=True, ser_json_inf_nan="constants")
    _order: tuple[str, ...] = PrivateAttr(default=())

    @model_validator(mode="wrap")
    @classmethod
    def _read(cls, data: Any, handler: Any) -> Any:
        model = handler(data)
        if isinstance(data, dict):
            model._order = tuple(data)
        return model

    @model_serializer(mode="wrap")
    def _write(self, handler: Any) -> dict[str, Any]:
        out = handler(self)
        unset = set(type(self).model_fields) - self.model_fields_set
        dropped = unset | {type(self).model_fields[n].alias for n in unset} - {None}
        return in_read_order({k: v for k, v in out.items() if k not in dropped}, self._order)
