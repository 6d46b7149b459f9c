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
            n for n in _imports(path) if n.startswith("nvtx_phases.analysis")
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


def _analysis_import_graph() -> dict[str, set[str]]:
    """Module → the analysis modules it imports (at module level or inside functions).

    Modules are named by their path (``analysis.run.pipeline``); inside the package imports are
    relative. ``from .pkg import name`` counts the submodule ``analysis.pkg.name`` where there is
    one, else the package; imports under ``if __name__ == "__main__":`` do not count.
    """
    modules = {}
    for path in _modules("analysis"):
        name = ".".join(path.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
        modules[name] = path
    graph: dict[str, set[str]] = {name: set() for name in modules}
    for name, path in modules.items():
        tree = ast.parse(path.read_text(encoding="utf-8"))
        main_guards = [
            node
            for node in ast.walk(tree)
            if isinstance(node, ast.If) and "__main__" in ast.unparse(node.test)
        ]
        guarded = {id(n) for guard in main_guards for n in ast.walk(guard)}
        for node in ast.walk(tree):
            if id(node) in guarded:
                continue
            if isinstance(node, ast.ImportFrom) and node.level:
                package = name if path.name == "__init__.py" else name.rpartition(".")[0]
                base = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                target = f"{base}.{node.module}" if node.module else base
                subs = {f"{target}.{a.name}" for a in node.names} & modules.keys()
                graph[name] |= subs or ({target} & modules.keys())
            elif isinstance(node, ast.Import):
                graph[name] |= {a.name for a in node.names} & modules.keys()
    return graph


def test_the_analysis_has_no_import_cycles():
    graph = _analysis_import_graph()
    # every module's reach, by depth-first search: a cycle is a module that reaches itself
    cycles = []
    for start in graph:
        seen, stack = set(), list(graph[start])
        while stack:
            module = stack.pop()
            if module == start:
                cycles.append(start)
                break
            if module not in seen:
                seen.add(module)
                stack.extend(graph[module])
    assert cycles == []


def test_the_stage_packages_import_one_way():
    # read < normalize < aggregate < attribute < run: no package imports one above it
    order = ["read", "normalize", "aggregate", "attribute", "run"]
    graph = _analysis_import_graph()
    upward = sorted(
        f"{module} -> {target}"
        for module, targets in graph.items()
        for target in targets
        if module.split(".")[1:2]
        and target.split(".")[1:2]
        and module.split(".")[1] in order
        and target.split(".")[1] in order
        and order.index(target.split(".")[1]) > order.index(module.split(".")[1])
    )
    assert upward == []


def test_nothing_imports_the_analysis_by_its_folder_name():
    # installed as nvtx_phases.analysis; a bare `analysis` would load a second copy (or a user's
    # own analysis.py), so inside the package imports are relative and outside they are full
    offenders = []
    for folder in ("analysis", "nvtx_phases", "tests", "checks", "bench"):
        for path in _modules(folder):
            if "data" in path.relative_to(REPO).parts:
                continue
            bare = sorted(n for n in _imports(path) if n.split(".")[0] == "analysis")
            if bare:
                offenders.append(f"{path.relative_to(REPO)}: {bare}")
    assert offenders == []


def test_pyproject_lists_every_package():
    try:
        import tomllib
    except ImportError:  # Python 3.10
        import tomli as tomllib

    config = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))
    listed = set(config["tool"]["setuptools"]["packages"])
    on_disk = {
        "nvtx_phases." + ".".join(p.parent.relative_to(REPO).parts)
        for p in (REPO / "analysis").rglob("__init__.py")
    } | {"nvtx_phases"}
    assert on_disk == listed
