"""The report's sections as registered units, like the attacks (`llmaudit.analyze.attacks.registry`).

A section declares its key (its anchor in report.html and, when it carries data, its key in report.json), its place
in the order, its view (a `cells.Section` that report.md and report.html both render), whether report.html folds it,
and optionally its own Markdown, HTML or terminal lines, its pydantic model and how its data is built from the
analysis result. The renderers iterate over `registered_sections()`; the shipped sections are registered by
`llmaudit.report.view`. docs/architecture.md, "Adding a report section", shows one added in one module.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pydantic import BaseModel
from rich.text import Text

from llmaudit.report.cells import Section
from llmaudit.report.models import ReportJson

SectionView = Callable[[ReportJson], Section | None]
"""The section's view model from the typed report; None leaves the section out of this report."""


@dataclass(frozen=True)
class SectionSpec:
    """One section of the report, registered with `register`.

    Attributes:
        key: the section's anchor in report.html; also its key in report.json when it carries data (`model`).
        order: its place among the sections, ascending (the shipped ones use multiples of 10).
        view: the report's view model of the section (paragraphs, tables, bullets, figures), or None to leave it out.
        folded: report.html shows it collapsed under its title (a diagnostic the reader opens).
        nav: report.html lists it in the navigation line under the title.
        markdown: its report.md lines instead of the ones rendered from `view`, given the report and the view.
        html: its report.html block instead of the one rendered from `view`, given the report and the view.
        terminal: its lines on the terminal answer screen, given the report and the screen's width in columns.
        model: the pydantic model of the data it adds to report.json under `key` (part of the JSON schema).
        build: its data from the analysis result and the report built so far (a `model`, a mapping, or None
            where it has none); required with `model`.
    """

    key: str
    order: int
    view: SectionView
    folded: bool = False
    nav: bool = True
    markdown: Callable[[ReportJson, Section], list[str]] | None = None
    html: Callable[[ReportJson, Section], str] | None = None
    terminal: Callable[[ReportJson, int], list[Text]] | None = None
    model: type[BaseModel] | None = None
    build: Callable[[Any, dict[str, Any]], Any] | None = None

    def __post_init__(self) -> None:
        if (self.model is None) != (self.build is None):
            raise ValueError(f"report section {self.key!r}: a model and a build function go together")


_REGISTRY: dict[str, SectionSpec] = {}


def register(section: SectionSpec) -> SectionSpec:
    """Add a section to the report.

    Args:
        section: the section to add.

    Returns:
        The section, registered.

    Raises:
        ValueError: when its key is already registered, or its data would replace one of report.json's own keys.
    """
    if section.key in _REGISTRY:
        raise ValueError(f"report section {section.key!r} is already registered")
    if section.model is not None and section.key in ReportJson.model_fields:
        raise ValueError(f"report section {section.key!r}: report.json already has a key {section.key!r}")
    _REGISTRY[section.key] = section
    return section


def unregister(key: str) -> None:
    """Remove a registered section (a test's own section, once the test is done).

    Args:
        key: the section's key.

    Raises:
        KeyError: when no section of that key is registered.
    """
    del _REGISTRY[key]


def registered_sections() -> list[SectionSpec]:
    """The registered sections in the report's order.

    Returns:
        The sections by ascending `order`, sections of one order in the order they were registered.
    """
    return sorted(_REGISTRY.values(), key=lambda s: s.order)


def data_sections() -> list[SectionSpec]:
    """The registered sections that add data of their own to report.json.

    Returns:
        The sections with a model, in the report's order.
    """
    return [s for s in registered_sections() if s.model is not None]


def built_section_data(result: Any, report: dict[str, Any]) -> dict[str, Any]:
    """The data the registered sections add to report.json, each validated by its model.

    Args:
        result: the analysis result the report is built from.
        report: the report built so far (report.json's own keys).

    Returns:
        {section key: its data as JSON}, for each section with a model whose build returned data.

    Raises:
        pydantic.ValidationError: when a section's data does not fit its model.
    """
    out: dict[str, Any] = {}
    for section in data_sections():
        assert section.build is not None and section.model is not None  # SectionSpec requires both together
        data = section.build(result, report)
        if data is not None:
            out[section.key] = section.model.model_validate(data).model_dump(mode="json")
    return out


def section_data(report: ReportJson, key: str) -> BaseModel | None:
    """A registered section's data in a report, typed by the section's model.

    Args:
        report: the typed report.
        key: the section's key.

    Returns:
        The data validated by the section's model, or None where the report carries none.

    Raises:
        KeyError: when no section of that key is registered.
        ValueError: when the section declares no model.
        pydantic.ValidationError: when the report's data does not fit the model.
    """
    model = _REGISTRY[key].model
    if model is None:
        raise ValueError(f"report section {key!r} carries no data of its own")
    data = (report.model_extra or {}).get(key)
    return None if data is None else model.model_validate(data)


def add_section_schemas(schema: dict[str, Any]) -> dict[str, Any]:
    """report.json's JSON schema with the data of the registered sections added.

    Args:
        schema: the schema generated from `ReportJson` (its definitions under "$defs").

    Returns:
        The same schema, each registered model a property of the report (null allowed) with its definitions.

    Raises:
        RuntimeError: when a section's model defines a model of the same name as another one differently.
    """
    defs = schema.setdefault("$defs", {})
    for section in data_sections():
        assert section.model is not None
        own = section.model.model_json_schema(ref_template="#/$defs/{model}")
        own_defs = own.pop("$defs", {}) | {section.model.__name__: own}
        clash = {k for k in set(defs) & set(own_defs) if defs[k] != own_defs[k]}
        if clash:
            raise RuntimeError(f"report section {section.key!r} redefines the models {sorted(clash)}")
        defs.update(own_defs)
        ref = {"$ref": f"#/$defs/{section.model.__name__}"}
        schema["properties"][section.key] = {"anyOf": [{"type": "null"}, ref]}
    return schema
