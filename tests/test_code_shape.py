"""The shape the code keeps (docs/architecture.md): modules under 500 lines, functions under 50 lines and at most 8
parameters (a command's typer signature, one parameter per option, excepted), and the report reading typed results
rather than chains of `.get(...) or {}`. A function's length is its code: the signature and body without the docstring
(an `Args:`/`Returns:` docstring documents, it does not add logic); a module's length counts every line."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SOURCES = sorted((ROOT / "src" / "llmaudit").rglob("*.py")) + sorted((ROOT / "benchmarks").rglob("*.py"))
MAX_MODULE_LINES = 500
MAX_FUNCTION_LINES = 50
MAX_PARAMETERS = 8


def _functions(path: Path):
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            yield node


def _length(node: ast.FunctionDef) -> int:
    """Lines from the `def` to the end of the body, less the docstring's lines."""
    total = node.end_lineno - node.lineno + 1
    first = node.body[0]
    if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str):
        total -= first.end_lineno - first.lineno + 1
    return total


def _parameters(node: ast.FunctionDef) -> int:
    a = node.args
    names = [*a.posonlyargs, *a.args, *a.kwonlyargs]
    n = len(names) + (a.vararg is not None) + (a.kwarg is not None)
    return n - (1 if names and names[0].arg in ("self", "cls") else 0)


def _is_command(path: Path, node: ast.FunctionDef) -> bool:
    """A typer command: a function under commands/ decorated with `app.command(...)` / `validate_app.command(...)`."""
    return path.parent.name == "commands" and any("command" in ast.unparse(d) for d in node.decorator_list)


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_no_module_is_over_500_lines():
    long = {_rel(p): n for p in SOURCES if (n := len(p.read_text(encoding="utf-8").splitlines())) > MAX_MODULE_LINES}
    assert long == {}


def test_no_function_is_over_50_lines():
    long = {
        f"{_rel(p)}:{f.name}": _length(f)
        for p in SOURCES
        for f in _functions(p)
        if _length(f) > MAX_FUNCTION_LINES and not _is_command(p, f)
    }
    assert long == {}


def test_no_function_takes_more_than_8_parameters_outside_the_typer_signatures():
    wide = {
        f"{_rel(p)}:{f.name}": _parameters(f)
        for p in SOURCES
        for f in _functions(p)
        if _parameters(f) > MAX_PARAMETERS and not _is_command(p, f)
    }
    assert wide == {}


@pytest.mark.parametrize("package", ["report"])
def test_the_report_reads_typed_results_not_fallback_chains(package):
    files = sorted((ROOT / "src" / "llmaudit" / package).rglob("*.py"))
    assert sum(p.read_text(encoding="utf-8").count("or {}") for p in files) < 10
