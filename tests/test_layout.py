"""The architecture's rules, checked on the source: the capture side stays free of the analysis,
and modules and functions stay small enough to read."""

from __future__ import annotations

import ast
from pathlib import Path

from nvtxp_testkit import REPO

MAX_FUNCTION_LINES = 80
MAX_MODULE_LINES = 400


def _modules(package: str) -> list[Path]:
    return sorted((REPO / package).rglob("*.py"))


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.add(node.module)
    return names


def test_capture_package_never_imports_the_analysis():
    offenders = {
        str(path.relative_to(REPO)): sorted(
            n for n in _imports(path) if n.split(".")[0] == "analysis"
        )
        for path in _modules("nvtx_phases")
    }
    assert {k: v for k, v in offenders.items() if v} == {}


def test_capture_package_needs_only_stdlib_and_nvtx_at_import():
    # heavy packages (torch, verl, pynvml) are imported inside functions, where they are used
    allowed = {"nvtx", "nvtx_phases", "__future__"}
    third_party = {}
    for path in _modules("nvtx_phases"):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        top = [n for n in tree.body if isinstance(n, ast.Import | ast.ImportFrom)]
        names = {
            (alias.name if isinstance(n, ast.Import) else n.module or "").split(".")[0]
            for n in top
            for alias in n.names
        }
        extra = {n for n in names if n not in allowed and not _is_stdlib(n)}
        if extra:
            third_party[str(path.relative_to(REPO))] = sorted(extra)
    assert third_party == {}


def _is_stdlib(name: str) -> bool:
    import sys

    return name in sys.stdlib_module_names


def test_functions_and_modules_stay_small():
    too_long = []
    for package in ("analysis", "nvtx_phases"):
        for path in _modules(package):
            text = path.read_text(encoding="utf-8")
            where = str(path.relative_to(REPO))
            if text.count("\n") > MAX_MODULE_LINES:
                too_long.append(f"{where}: {text.count(chr(10))} lines")
            for node in ast.walk(ast.parse(text)):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    length = (node.end_lineno or node.lineno) - node.lineno + 1
                    if length > MAX_FUNCTION_LINES:
                        too_long.append(f"{where}:{node.lineno} {node.name}: {length} lines")
    assert too_long == []
