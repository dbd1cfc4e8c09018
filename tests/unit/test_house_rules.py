"""The house's size rules (issue 33): no module of a core or of ``common`` over 700
lines, no function anywhere in the source over 60 lines but for argument parsers
(a function that calls ``add_argument``)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORE_PACKAGES = ("global_master", "local_master", "worker", "common")
MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 60
NOT_SOURCE = {"tests", ".git", "build", "dist", "results", "docs"}


def _source_files() -> list[Path]:
    return sorted(
        p
        for p in ROOT.rglob("*.py")
        if not NOT_SOURCE.intersection(p.relative_to(ROOT).parts)
        and not any(part.endswith(".egg-info") or part.startswith(".") for part in p.parts)
    )


def _is_parser(fn: ast.FunctionDef | ast.AsyncFunctionDef) -> bool:
    return any(
        isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and n.func.attr == "add_argument"
        for n in ast.walk(fn)
    )


def test_no_core_module_is_over_700_lines() -> None:
    long = {
        str(p.relative_to(ROOT)): n
        for pkg in CORE_PACKAGES
        for p in sorted((ROOT / pkg).rglob("*.py"))
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert long == {}


def test_no_function_is_over_60_lines_but_argument_parsers() -> None:
    long = {}
    for p in _source_files():
        for fn in ast.walk(ast.parse(p.read_text())):
            if isinstance(fn, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = (fn.end_lineno or fn.lineno) - fn.lineno + 1
                if lines > MAX_FUNCTION_LINES and not _is_parser(fn):
                    long[f"{p.relative_to(ROOT)}:{fn.name}"] = lines
    assert long == {}


def test_the_rules_see_the_source() -> None:
    """The walk finds the cores (a rule over no file would pass for nothing)."""
    names = {str(p.relative_to(ROOT)) for p in _source_files()}
    assert {"global_master/core.py", "local_master/core.py", "common/codec.py"} <= names
