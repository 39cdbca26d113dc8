"""The docstrings the code keeps (docs/development.md, "Rules the tests keep on the code"): every public function
and method of analyze/, report/, quantize/ and score/ opens with a summary line and has `Args:` and `Returns:` (or
`Yields:`) sections; no docstring or comment anywhere in src/ holds history (a year, a commit, "landed", ...) or a
measured time or size, which go stale with every change and every machine (measurements live in docs/results.md).

Read from the source with `ast` and `tokenize`: nothing of the package is imported. Every problem is reported as
`path:line`, so one failing run lists all of them.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "llmaudit"
DOCUMENTED = ("analyze", "report", "quantize", "score")
SECTION = re.compile(r"^\s*(Args|Arguments|Returns|Yields|Raises|Note|Notes|Example|Examples|Attributes):\s*$")
ARG_ENTRY = re.compile(r"^(\s*)(\*{0,2})([A-Za-z_]\w*)\s*(\([^)]*\))?\s*:")
SKIPPED_DECORATORS = ("validator", "serializer", "overload")
PROPERTY_DECORATORS = ("property", "cached_property", "setter", "getter", "deleter")


def _rel(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else path.name


def _decorators(node: ast.FunctionDef) -> list[str]:
    return [ast.unparse(d).split("(")[0] for d in node.decorator_list]


def _public_functions(tree: ast.Module) -> Iterator[tuple[str, ast.FunctionDef]]:
    """(qualified name, node) of each module-level public function and each public method of a public class."""
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and not node.name.startswith("_"):
            yield node.name, node
        elif isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
            for item in node.body:
                if isinstance(item, ast.FunctionDef | ast.AsyncFunctionDef) and not item.name.startswith("_"):
                    yield f"{node.name}.{item.name}", item


def _own_nodes(node: ast.FunctionDef) -> Iterator[ast.AST]:
    """The nodes of a function's body, not those of functions, lambdas or classes defined inside it."""
    stack = list(node.body)
    while stack:
        child = stack.pop()
        yield child
        if not isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(child))


def _is_none(value: ast.AST | None) -> bool:
    return value is None or (isinstance(value, ast.Constant) and value.value is None)


def _gives_a_value(node: ast.FunctionDef) -> bool:
    """True when the function returns (or yields) a value: an annotation other than None/NoReturn, or a `return
    <value>` / `yield <value>` in its own body. A generator yielding nothing (a context manager's `yield`) gives
    none."""
    own = list(_own_nodes(node))
    yields = [n for n in own if isinstance(n, ast.Yield | ast.YieldFrom)]
    if yields:
        return any(not _is_none(n.value) for n in yields)
    if node.returns is not None:
        return ast.unparse(node.returns).strip("'\"") not in ("None", "NoReturn", "Never", "typing.NoReturn")
    return any(isinstance(n, ast.Return) and not _is_none(n.value) for n in own)


def _parameters(node: ast.FunctionDef, is_method: bool) -> list[str]:
    a = node.args
    names = [p.arg for p in (*a.posonlyargs, *a.args, *a.kwonlyargs)]
    if is_method and names and names[0] in ("self", "cls") and "staticmethod" not in _decorators(node):
        names = names[1:]
    return names + [p.arg for p in (a.vararg, a.kwarg) if p is not None]


def _section(lines: list[str], title: str) -> list[str] | None:
    """The lines of a docstring's section (`Args:`), up to the next section title; None when it has none."""
    for i, line in enumerate(lines):
        if line.strip() == f"{title}:":
            rest = lines[i + 1 :]
            end = next((j for j, text in enumerate(rest) if SECTION.match(text)), len(rest))
            return rest[:end]
    return None


def _documented_arguments(section: list[str]) -> set[str]:
    """The names the entries of an `Args:` section give (`name:` or `name (type):`, `*args:`, at the entries'
    indentation: the continuation lines of an entry are indented deeper)."""
    entries = [m for line in section if (m := ARG_ENTRY.match(line))]
    if not entries:
        return set()
    indent = min(len(m.group(1)) for m in entries)
    return {m.group(3) for m in entries if len(m.group(1)) == indent}


def _docstring_problems(qualname: str, node: ast.FunctionDef, is_method: bool) -> list[str]:
    doc = ast.get_docstring(node)
    if not doc or not doc.strip():
        return [f"{qualname}: no docstring"]
    lines = doc.splitlines()
    if not lines[0].strip() or SECTION.match(lines[0]):
        return [f"{qualname}: the docstring does not open with a summary line"]
    if any(d.split(".")[-1] in PROPERTY_DECORATORS for d in _decorators(node)):
        return []  # a property reads as an attribute: its summary says what it holds
    problems = []
    parameters = _parameters(node, is_method)
    args = _section(lines, "Args")
    if parameters and args is None:
        problems.append(f"{qualname}: no Args: section (parameters: {', '.join(parameters)})")
    elif parameters:
        documented = _documented_arguments(args)
        if missing := [p for p in parameters if p not in documented]:
            problems.append(f"{qualname}: Args: does not name {', '.join(missing)}")
        if extra := sorted(documented - set(parameters)):
            problems.append(f"{qualname}: Args: names {', '.join(extra)}, not parameters of the function")
    if _gives_a_value(node) and _section(lines, "Returns") is None and _section(lines, "Yields") is None:
        problems.append(f"{qualname}: it returns a value but has no Returns: (or Yields:) section")
    return problems


def docstring_problems(path: Path) -> list[str]:
    """Every missing summary line, Args: entry and Returns: section of one module's public functions."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for qualname, node in _public_functions(tree):
        if any(d.split(".")[-1].endswith(SKIPPED_DECORATORS) for d in _decorators(node)):
            continue  # a pydantic validator/serializer or a typing overload: not called by name
        found += [f"{_rel(path)}:{node.lineno} {p}" for p in _docstring_problems(qualname, node, "." in qualname)]
    return found


@pytest.mark.parametrize("package", DOCUMENTED)
def test_every_public_function_has_a_summary_args_and_returns(package):
    problems = [p for path in sorted((PACKAGE / package).rglob("*.py")) for p in docstring_problems(path)]
    assert not problems, f"{len(problems)} docstring problems in {package}/:\n" + "\n".join(problems)


# ---------------------------------------------------------------------------------------- history and figures

CITATION = re.compile(r"(?:[A-Z][\w'-]+|et al\.)\s*,?\s*\(?\s*$")
"""What precedes a year that dates a publication, not the code: "Carlini 2022", "Morris et al. (2025",
"Jagielski (2023", "ICML 2024". A reference to a paper is not history."""

YEAR = re.compile(r"(?<![\w.-])(?:19[5-9]\d|20[0-3]\d)(?![\w%])")
"""A year 1950-2039 standing alone ("2048 tokens" is a size, not a year)."""

COMMIT = re.compile(r"(?<![\w./-])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![\w-])")
"""7 to 40 lowercase hex digits with a digit and a letter (an abbreviated or full git hash); 0x... constants and
sha256 digests (64) are not matched."""

HISTORY = re.compile(
    r"\blanded\b|\bthe old (?!set\b)|\bpreviously\b|\bused to (?:be|have|live|sit|read|return|compute|take)\b"
    r"|\bsince (?:v|llmaudit )?\d+\.\d|\bbefore the \w+ existed\b|\bno longer (?:used|needed|exists?|supported)\b"
    r"|\bissue #?\d+\b|\bold(?:er)? (?:path|name|rule|module|location|engine)s?\b|\bformerly\b|\brenamed from\b"
    r"|\bmoved (?:here )?from\b",
    re.IGNORECASE,
)
"""Words that tell what the code was rather than what it is. Left out on purpose, because the code uses them for
what it does now: "no longer" alone (a SLURM job that "no longer" exists, an attack "no longer registered" in an
old report.json), "used to" alone ("the data used to calibrate"), "the old set" (common/io.py: the set of files a
write replaces), "older" alone (an older store or report.json that llmaudit still reads is a format it supports)."""

FIGURE = re.compile(
    r"(?<![\w.])\d+(?:[.,]\d+)?\s*(?:ms|s|sec|seconds?|min|minutes?|hours?|GiB|GB|MiB|MB|KiB|KB|kB)(?:/s)?(?!\w)"
    r"|(?<![\w.])\d+(?:\.\d+)?\s*(?:%|x|times)\s+(?i:faster|slower|quicker|longer|shorter|larger|smaller)\b"
    r"|\b(?:took|ran in|runs in|measured at)\s+(?:about\s+|~)?\d",
)
"""A time or a size with its unit, a speed-up, or "took N": a measurement of some machine and some version."""

SPECIFIED_FIGURES = {
    # Each a limit or a default the code itself sets (its value is the specification, not a measurement).
    ("bounded.py", "50 MB"): "the largest JSON llmaudit writes, computed from the format's limits",
    ("bounded.py", "4 GB"): "MAX_PARQUET_VALUES expressed in bytes (500,000,000 float64 values)",
    ("memory.py", "32 MiB"): "glibc's documented ceiling of its dynamic mmap threshold (DYNAMIC_CEILING)",
    ("memory.py", "128 KiB"): "glibc's documented initial mmap threshold",
    ("memory.py", "4 MiB"): "the mmap threshold llmaudit sets (`bounded_heap`)",
    ("sections.py", "1.5 GiB"): "the default activation budget of train.token_budget",
    ("training.py", "1.5 GiB"): "the default activation budget of train.token_budget (the constant's doc)",
    ("chat_render.py", "64 MiB"): "MAX_LINE_BYTES, the longest JSONL line llmaudit reads",
    ("calibration.py", "256 MiB"): "the largest calibration file read (a limit)",
    ("given.py", "16 MiB"): "the largest config.json read (a limit)",
    ("engine.py", "256 MiB"): "HEAD_LOGITS_BYTES, the default logits budget",
    ("sections.py", "1.3x faster"): "the speed-up of bf16 over float32 matmuls above which dtype auto picks bf16",
    ("slurm.py", "5 minutes"): "SLURM's documented default of MinJobAge",
}
"""Figures that are the code's own limits and defaults (or a dependency's documented one), (file name, figure)
-> why it is allowed; keyed by file name so that a module keeps its allowance when it moves."""


def _texts(path: Path) -> Iterator[tuple[int, str]]:
    """(first line, text) of every docstring (module, class, function, attribute: any string expression
    statement) and every comment of a module."""
    source = path.read_text(encoding="utf-8")
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str):
            yield node.lineno, node.value.value
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            yield token.start[0], token.string


def _findings(relative: str, text: str) -> Iterator[tuple[int, str, str]]:
    """(line offset, kind, matched text) of each year, commit, history word and measured figure in one text."""
    for m in YEAR.finditer(text):
        before = text[max(0, m.start() - 40) : m.start()]
        if not CITATION.search(before) and not text[m.start() - 6 : m.end() + 3].endswith("draft 2020-12"):
            yield text.count("\n", 0, m.start()), "a year", m.group(0)  # draft 2020-12: JSON Schema's version
    for kind, pattern in (("a commit", COMMIT), ("history", HISTORY), ("a measured figure", FIGURE)):
        for m in pattern.finditer(text):
            found = " ".join(m.group(0).split())
            if kind != "a measured figure" or (Path(relative).name, found) not in SPECIFIED_FIGURES:
                yield text.count("\n", 0, m.start()), kind, found


def history_problems(path: Path) -> list[str]:
    """Every year, commit hash, history word and measured figure in one module's docstrings and comments."""
    relative = str(path.relative_to(PACKAGE))
    return [
        f"{_rel(path)}:{line + offset} {kind}: {found!r}"
        for line, text in _texts(path)
        for offset, kind, found in _findings(relative, text)
    ]


def _packages() -> list[str]:
    return sorted(p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()) + ["."]


@pytest.mark.parametrize("package", _packages())
def test_no_docstring_or_comment_holds_history_or_a_measured_figure(package):
    files = sorted(PACKAGE.glob("*.py")) if package == "." else sorted((PACKAGE / package).rglob("*.py"))
    problems = sorted({p for path in files for p in history_problems(path)})
    assert not problems, f"{len(problems)} in {package}/:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    "text, kinds",
    [
        ("The landed path, since 0.2 (ae578c7, 2025-03-01).", ["a year", "a commit", "history", "history"]),
        ("Scoring took 12 s and 3.4 GiB on SmolLM2-135M; 2x faster, 4x SLOWER.", ["a measured figure"] * 4),
        ("LiRA (Carlini et al. 2022), RMIA (ICML 2024); 2048 tokens; sha 0x1f2e3d4c.", []),
        ("The old set of files stays; a job SLURM no longer knows; the data used to calibrate.", []),
    ],
)
def test_the_history_check_finds_what_it_names_and_passes_what_it_allows(text, kinds):
    assert sorted(kind for _, kind, _ in _findings("x.py", text)) == sorted(kinds)


def test_the_docstring_check_finds_missing_sections(tmp_path):
    module = tmp_path / "m.py"
    module.write_text(
        'def f(a, *rest, b=1, **kw) -> int:\n    """Sum.\n\n    Args:\n        a (int): one.\n'
        '            b: a continuation line, not an entry.\n        *rest: more.\n        c: none.\n    """\n'
        "    return a\n\n"
        'class C:\n    def g(self, x):\n        """G.\n\n        Args:\n            x: x.\n\n'
        '        Returns:\n            x.\n        """\n        return x\n\n'
        '    @property\n    def p(self) -> int:\n        """A property."""\n        return 1\n\n'
        "def h() -> None:\n    pass\n\n"
        '@contextlib.contextmanager\ndef cm(x):\n    """Within.\n\n    Args:\n        x: x.\n    """\n    yield\n\n'
        'def gen(n) -> Iterator[int]:\n    """Count.\n\n    Args:\n        n: n.\n    """\n    yield n\n\n'
        '@field_validator("a")\ndef check(cls, v):\n    return v\n',
        encoding="utf-8",
    )
    problems = [p.split(" ", 1)[1] for p in docstring_problems(module)]
    assert problems == [
        "f: Args: does not name b, kw",
        "f: Args: names c, not parameters of the function",
        "f: it returns a value but has no Returns: (or Yields:) section",
        "h: no docstring",
        "gen: it returns a value but has no Returns: (or Yields:) section",
    ]


# ---------------------------------------------------------------------------------------- test names

TEST_NAME_HISTORY = re.compile(
    r"landed|(?:^|_)old(?:_|$)|previous_version|earlier_version|before_the_(?:option|rule|dtype|new)"
    r"|round_(?:one|two|three|four|five)|(?<![0-9a-z])(?=[0-9a-f]*\d)(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}(?![0-9a-z])"
)
"""What a test's or a fixture's name would say about the code's past ("landed", "old", "round four", a commit)
instead of what it checks."""


def test_test_and_fixture_names_say_what_they_check_not_what_was_there_before():
    tests = ROOT / "tests"
    named = [f"{_rel(p)}: file name" for p in sorted(tests.rglob("*")) if TEST_NAME_HISTORY.search(p.name.lower())]
    for path in sorted(tests.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            is_function = isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            fixture = is_function and any("fixture" in ast.unparse(d) for d in node.decorator_list)
            if is_function and (node.name.startswith("test_") or fixture) and TEST_NAME_HISTORY.search(node.name):
                named.append(f"{_rel(path)}:{node.lineno} {node.name}")
    assert not named, f"{len(named)} names carry history:\n" + "\n".join(named)
