"""The house's rules, read from the code's own imports (docs/ARCHITECTURE.md draws them):

- every module belongs to a layer by its folder, and no import runs up a layer;
- no import circles between modules, function-local imports included;
- no reach into another package's private (``_``-prefixed) module;
- a function-local import of the project's own module is there only to keep an optional or heavy
  dependency lazy: the module it names imports one (itself or through the project's modules); a
  package's ``__getattr__`` (PEP 562) may re-export lazily, and ``TYPE_CHECKING`` imports never run
  (they count for the layers and the circles: a module's types are part of what it depends on);
- pyproject.toml lists exactly the package folders, mapped into the one ``cliptrack`` namespace.
"""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ROOTS = {"cliptrack": ROOT / "tracking", "cliptrack.adapters": ROOT / "adapters"}

LAYERS = (
    "cliptrack.core",
    "cliptrack.store",
    "cliptrack.backends",
    "cliptrack.compare.stats",
    "cliptrack.compare",
    "cliptrack.compare.views",
    "cliptrack.log",
    "cliptrack.cli",
    "cliptrack",
)
"""Layers from the bottom up, by package prefix (the longest prefix decides): a module may import its
own layer and those below it. ``cliptrack`` itself (the package's ``__init__``) is the facade on top.
The backends stand on the store alone (a reader hands back ``cliptrack.store.frame.RunSet``); the
comparison stands above them, and of it only the views (the panels a backend's UI shows) use them."""

BACKENDS = "cliptrack.backends"
COMPARISON = "cliptrack.compare"
COMPARISON_MAY_IMPORT_BACKENDS = ("cliptrack.compare.views",)
"""The comparison's engine reads no store: only its views (the MLflow run, the W&B panels) use a backend."""

ADAPTER_LAYERS = (
    "cliptrack.adapters._compat",
    "cliptrack.adapters.shared",
    "cliptrack.adapters.losses",
    "cliptrack.adapters",
    "cliptrack.adapters.demo",
)
"""The adapters stand on ``cliptrack.core`` alone: the vendor seams, the parts every stack shares, the losses, then
the integrations (megatron, miles, tinker), then the demo trainer that drives both paths."""

INTEGRATION_LAYER = "cliptrack.adapters"
"""The layer of the stack integrations (megatron, miles, tinker and the next ones): each module or
package there is one integration, which imports the shared parts and the losses, never another
integration."""
SHARED = "cliptrack.adapters.shared"
SHARED_MAY_IMPORT = ("cliptrack.core", SHARED, "cliptrack.adapters._compat.tinker")
"""The shared parts stand on ``cliptrack.core`` (and torch, numpy) alone, and on tinker's public types
through their vendor seam: ``TensorData`` and ``ForwardBackwardOutput`` are the wire's types."""

ADAPTERS_MAY_IMPORT = ("cliptrack.core",)
TRACKING_MAY_IMPORT_ADAPTERS = ("cliptrack.cli",)
"""Only the command line (the demo entry point) runs the adapters; the rest of tracking never does."""

HEAVY = frozenset(
    {
        "numpy",
        "pandas",
        "scipy",
        "torch",
        "mlflow",
        "wandb",
        "wandb_workspaces",
        "plotly",
        "matplotlib",
        "megatron",
        "tinker",
        "tinker_cookbook",
        "nbclient",
        "nbformat",
        "sqlalchemy",
        "requests",
        "tqdm",
    }
)
"""Third-party packages kept lazy (optional extras, or slow to import for ``cliptrack --help``)."""


@dataclass(frozen=True)
class Import:
    """One import of a project module: who imports what, at which line, and whether at module level."""

    importer: str
    target: str
    line: int
    where: str


def _module_files() -> dict[str, Path]:
    files: dict[str, Path] = {}
    for prefix, root in ROOTS.items():
        for path in sorted(root.rglob("*.py")):
            if "__pycache__" in path.parts:
                continue
            parts = path.relative_to(root).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            files[".".join((prefix, *parts))] = path
    return files


MODULES = _module_files()


def _is_package(module: str) -> bool:
    return MODULES[module].name == "__init__.py"


def _resolve(name: str) -> str | None:
    """The project module an imported dotted name lands in (a module, or the package holding it)."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


TOP, LOCAL, TYPING, LAZY_EXPORT = "top", "local", "typing", "lazy export"
"""Where an import runs: at module import; inside a function; only for the type checker
(``if TYPE_CHECKING``); in a package's module-level ``__getattr__`` (PEP 562 lazy re-export)."""


def _walk(tree: ast.AST) -> Iterator[tuple[ast.AST, str]]:
    """Every import node with where it runs (TOP, LOCAL, TYPING or LAZY_EXPORT)."""

    def visit(node: ast.AST, where: str) -> Iterator[tuple[ast.AST, str]]:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.Import | ast.ImportFrom):
                yield child, where
            elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
                lazy = where == TOP and isinstance(child, ast.FunctionDef) and child.name == "__getattr__"
                yield from visit(child, LAZY_EXPORT if lazy else LOCAL if where == TOP else where)
            elif isinstance(child, ast.If) and _type_checking(child):
                yield from visit(child, TYPING)
            else:
                yield from visit(child, where)

    yield from visit(tree, TOP)


def _imports() -> tuple[list[Import], dict[str, set[str]]]:
    """Project imports of every module, and the third-party top-level names each imports at module level."""
    found: list[Import] = []
    third_party: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        third_party[module] = set()
        for node, where in _walk(tree):
            top = where == TOP
            if isinstance(node, ast.ImportFrom):
                assert node.level == 0, f"{path}:{node.lineno}: relative import (use the absolute name)"
                base = node.module or ""
                names = [f"{base}.{alias.name}" for alias in node.names] or [base]
                if not base.startswith("cliptrack") and top:
                    third_party[module].add(base.split(".")[0])
            else:
                names = [alias.name for alias in node.names]
                if top:
                    third_party[module].update(
                        n.split(".")[0] for n in names if not n.startswith("cliptrack")
                    )
            for name in names:
                if not name.startswith("cliptrack"):
                    continue
                target = _resolve(name)
                assert target is not None, f"{path}:{node.lineno}: {name} is no module of the project"
                if target != module:
                    found.append(Import(module, target, node.lineno, where))
    return found, third_party


IMPORTS, THIRD_PARTY = _imports()


def _layer(module: str) -> tuple[str, int]:
    if module.startswith("cliptrack.adapters"):
        layers = ADAPTER_LAYERS
        kind = "adapters"
    else:
        layers = LAYERS
        kind = "tracking"
    best = max((p for p in layers if module == p or module.startswith(p + ".")), key=len)
    return kind, layers.index(best)


def _where(imp: Import) -> str:
    return f"{MODULES[imp.importer].relative_to(ROOT)}:{imp.line}: {imp.importer} imports {imp.target}"


def test_no_import_runs_up_a_layer():
    wrong = []
    for imp in IMPORTS:
        kind, level = _layer(imp.importer)
        target_kind, target_level = _layer(imp.target)
        if kind == "adapters":
            if target_kind == "tracking" and not imp.target.startswith(ADAPTERS_MAY_IMPORT):
                wrong.append(_where(imp) + " (adapters stand on cliptrack.core alone)")
            elif target_kind == "adapters" and target_level > level:
                wrong.append(_where(imp) + f" (up: {ADAPTER_LAYERS[target_level]})")
        elif target_kind == "adapters":
            if not imp.importer.startswith(TRACKING_MAY_IMPORT_ADAPTERS):
                wrong.append(_where(imp) + " (only the command line runs the adapters)")
        elif target_level > level:
            wrong.append(_where(imp) + f" (up: {LAYERS[level]} -> {LAYERS[target_level]})")
    assert not wrong, "imports that run up a layer:\n" + "\n".join(wrong)


def _in(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_backends_import_no_comparison_module():
    wrong = [
        _where(imp) + " (a backend stands on cliptrack.core and cliptrack.store alone)"
        for imp in IMPORTS
        if _in(imp.importer, BACKENDS) and _in(imp.target, COMPARISON)
    ]
    assert not wrong, "backends that import the comparison:\n" + "\n".join(wrong)
    backend_modules = [m for m in MODULES if _in(m, BACKENDS)]
    assert len(backend_modules) > 20  # the rule reads real modules


def test_only_the_comparisons_views_import_a_backend():
    wrong = [
        _where(imp) + " (the comparison's engine reads no store)"
        for imp in IMPORTS
        if _in(imp.importer, COMPARISON)
        and not imp.importer.startswith(COMPARISON_MAY_IMPORT_BACKENDS)
        and _in(imp.target, BACKENDS)
    ]
    assert not wrong, "\n".join(wrong)


def _integration(module: str) -> str | None:
    """The integration ``module`` belongs to (``cliptrack.adapters.<name>``), ``None`` outside that layer."""
    if module == INTEGRATION_LAYER or _layer(module) != ("adapters", ADAPTER_LAYERS.index(INTEGRATION_LAYER)):
        return None
    return ".".join(module.split(".")[:3])


def test_no_integration_imports_another():
    wrong = []
    for imp in IMPORTS:
        mine, theirs = _integration(imp.importer), _integration(imp.target)
        if mine is not None and theirs is not None and mine != theirs:
            wrong.append(_where(imp) + f" (an integration imports {SHARED}, never another integration)")
    assert not wrong, "\n".join(wrong)


def test_the_shared_parts_import_only_core():
    wrong = [
        _where(imp)
        for imp in IMPORTS
        if imp.importer.startswith(SHARED) and not imp.target.startswith(SHARED_MAY_IMPORT)
    ]
    assert not wrong, f"{SHARED} imports only cliptrack.core and tinker's types:\n" + "\n".join(wrong)
    integrations = {_integration(m) for m in MODULES} - {None}
    assert {
        "cliptrack.adapters.megatron",
        "cliptrack.adapters.miles",
        "cliptrack.adapters.tinker",
    } <= integrations


def test_no_import_circles():
    edges: dict[str, set[str]] = {module: set() for module in MODULES}
    for imp in IMPORTS:
        # a package's __init__ re-exporting its own modules is not a circle with them
        if _is_package(imp.target) and imp.importer.startswith(imp.target + "."):
            continue
        edges[imp.importer].add(imp.target)
    try:
        graphlib.TopologicalSorter(edges).prepare()
    except graphlib.CycleError as error:
        pytest.fail(f"import circle: {' -> '.join(error.args[1])}")


def test_no_reach_into_another_packages_private_module():
    wrong = []
    for imp in IMPORTS:
        parts = imp.target.split(".")
        for i, part in enumerate(parts):
            if part.startswith("_") and not part.startswith("__"):
                owner = ".".join(parts[:i])
                if not (imp.importer == owner or imp.importer.startswith(owner + ".")):
                    wrong.append(_where(imp) + f" ({part} is private to {owner})")
                break
    assert not wrong, "\n".join(wrong)


def _heavy(module: str, seen: set[str] | None = None) -> bool:
    """Whether importing ``module`` imports a package of HEAVY (directly or through project modules)."""
    seen = set() if seen is None else seen
    if module in seen:
        return False
    seen.add(module)
    if THIRD_PARTY[module] & HEAVY:
        return True
    return any(_heavy(imp.target, seen) for imp in IMPORTS if imp.importer == module and imp.where == TOP)


def test_function_local_imports_only_keep_a_dependency_lazy():
    wrong = []
    for imp in IMPORTS:
        if imp.where != LOCAL:
            continue
        if not _heavy(imp.target):
            wrong.append(_where(imp) + " (imports nothing heavy: import it at the top)")
    assert not wrong, "function-local imports of light project modules:\n" + "\n".join(wrong)


def test_pyproject_lists_every_package_folder_in_one_namespace():
    tomllib = pytest.importorskip("tomllib")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    setuptools = project["tool"]["setuptools"]
    assert setuptools["package-dir"] == {"cliptrack": "tracking", "cliptrack.adapters": "adapters"}
    folders = sorted(m for m in MODULES if _is_package(m))
    assert sorted(setuptools["packages"]) == folders
    assert all(name == "cliptrack" or name.startswith("cliptrack.") for name in setuptools["packages"])


def test_the_layer_table_names_real_packages():
    for prefix in (*LAYERS, *ADAPTER_LAYERS, *ADAPTERS_MAY_IMPORT, *TRACKING_MAY_IMPORT_ADAPTERS):
        assert prefix in MODULES and _is_package(prefix), prefix
