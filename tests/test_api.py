"""docs/API.md against the code, both ways.

Each public module's ``__all__`` holds exactly the names API.md lists under it (public, then its
"Internal:" line); every module of the package is public, below a public module, or in an internal
package API.md names; and each public callable's documented signature has the code's parameters,
in order, with the same literal defaults.
"""

from __future__ import annotations

import ast
import importlib
import inspect
import re
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
API = ROOT / "docs" / "API.md"
FOLDERS = {"cliptrack.adapters": ROOT / "adapters", "cliptrack": ROOT / "tracking"}
"""Dotted prefix -> its folder (the installed layout: tracking/ is cliptrack, adapters/ cliptrack.adapters)."""
CONTAINERS = {"cliptrack", "cliptrack.adapters"}
"""Packages whose submodules are not covered by the package's own entry."""
NEEDS_A_STACK = {("cliptrack.adapters.trl", "GRPOTrainer")}
"""Names built from a training stack this environment lacks (TRL): signature read from the source."""


@dataclass
class Module:
    name: str
    public: dict[str, str] = field(default_factory=dict)  # name -> documented signature line
    internal: set[str] = field(default_factory=set)


def _api(page: Path = API) -> tuple[dict[str, Module], set[str]]:
    """The page's public modules (their public names with signatures, and internal names) and its
    internal packages."""
    modules: dict[str, Module] = {}
    internal_packages: set[str] = set()
    current: Module | None = None
    in_internal_packages = False
    lines = page.read_text().splitlines()
    for i, line in enumerate(lines):
        if line.startswith("## "):
            in_internal_packages = line.strip() == "## Internal packages"
            found = re.fullmatch(r"## `([\w.]+)`", line.strip())
            current = None
            if found:
                current = modules.setdefault(found.group(1), Module(found.group(1)))
        elif line.startswith("### ") and current is not None:
            name = re.fullmatch(r"### `(\w+)`", line.strip())
            assert name, f"API.md line {i + 1}: a name heading is ### `name`, got {line!r}"
            fence = next(j for j in range(i + 1, len(lines)) if lines[j].startswith("```"))
            current.public[name.group(1)] = lines[fence + 1]
        elif line.startswith("Internal:") and current is not None:
            block = []
            for rest in lines[i:]:
                if not rest.strip():
                    break
                block.append(rest)
            current.internal |= set(re.findall(r"`(\w+)`", " ".join(block)))
        elif in_internal_packages:
            internal_packages |= set(re.findall(r"`(cliptrack[\w.]*)`", line))
    return modules, internal_packages


def _source(module: str) -> Path:
    for prefix, folder in FOLDERS.items():
        if module == prefix or module.startswith(prefix + "."):
            parts = module[len(prefix) :].strip(".").split(".") if module != prefix else []
            base = folder.joinpath(*parts)
            return base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
    raise AssertionError(f"{module} is not in cliptrack")


def _all_of(path: Path) -> list[str] | None:
    """A module's ``__all__``, read from its source (no import: the adapters need their stacks)."""
    for node in ast.parse(path.read_text()).body:
        targets = (
            node.targets
            if isinstance(node, ast.Assign)
            else [node.target]
            if isinstance(node, ast.AnnAssign)
            else []
        )
        if any(isinstance(t, ast.Name) and t.id == "__all__" for t in targets):
            assert node.value is not None
            return list(ast.literal_eval(node.value))
    return None


def _every_module() -> list[str]:
    """Every module of the installed package, dotted."""
    out = []
    for prefix, folder in FOLDERS.items():
        for path in sorted(folder.rglob("*.py")):
            relative = path.relative_to(folder)
            if "_vendor" in relative.parts or (prefix == "cliptrack" and relative.parts[0] == "adapters"):
                continue
            parts = list(relative.with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out.append(".".join([prefix, *parts]) if parts else prefix)
    return out


MODULES, INTERNAL_PACKAGES = _api()


def test_api_md_names_some_thirty_public_names_in_the_public_modules():
    assert {"cliptrack", "cliptrack.compare", "cliptrack.backends", "cliptrack.adapters.losses"} <= set(
        MODULES
    )
    public = sum(len(m.public) for m in MODULES.values())
    assert 25 <= public <= 45, f"{public} public names: API.md is meant to stay one page of essentials"
    assert {"Tracker", "Limits", "Watch", "load_runs"} <= set(MODULES["cliptrack"].public)


@pytest.mark.parametrize("module", sorted(MODULES))
def test_each_public_module_exports_exactly_what_api_md_lists(module):
    _check_exports(MODULES[module])


def _check_exports(documented: Module) -> None:
    module = documented.name
    both = sorted(set(documented.public) & documented.internal)
    assert not both, f"{module}: {both} listed both as public and as internal in docs/API.md"
    exported = _all_of(_source(module))
    assert exported is not None, f"{module} has no __all__; docs/API.md lists it as a public module"
    listed = set(documented.public) | documented.internal
    missing = sorted(listed - set(exported))
    undocumented = sorted(set(exported) - listed)
    assert not missing, f"docs/API.md lists {missing} under {module}, whose __all__ lacks them"
    assert not undocumented, (
        f"{module}.__all__ exports {undocumented}, which docs/API.md does not list "
        "(document them, as public or internal, or drop them from __all__)"
    )


def test_every_module_is_public_or_internal_by_api_md():
    covered = (set(MODULES) - CONTAINERS) | INTERNAL_PACKAGES
    unplaced = []
    for module in _every_module():
        if module in MODULES or module in CONTAINERS:
            continue
        parents = [module.rsplit(".", n)[0] for n in range(1, module.count(".") + 1)]
        if module not in covered and not any(p in covered for p in parents):
            unplaced.append(module)
    assert not unplaced, (
        f"{unplaced}: neither a public module of docs/API.md, below one, nor in its internal packages"
    )
    for package in INTERNAL_PACKAGES:
        assert _source(package).exists(), (
            f"docs/API.md names the internal package {package}, which does not exist"
        )


def _documented_parameters(line: str) -> list[tuple[str, object]]:
    """The parameters of a documented signature ``name(a, b=1, *, c=None)``: (name, literal
    default or ``inspect.Parameter.empty``; ``...`` for a default that is not a literal)."""
    found = re.fullmatch(r"\w+\((.*)\)", line.strip())
    assert found, f"signature {line!r} is not name(parameters)"
    args = ast.parse(f"def f({found.group(1)}): pass").body[0].args  # type: ignore[attr-defined]
    positional = [*args.posonlyargs, *args.args]
    defaults = [inspect.Parameter.empty] * (len(positional) - len(args.defaults)) + list(args.defaults)
    out = list(zip([a.arg for a in positional], defaults, strict=True))
    if args.vararg:
        out.append((args.vararg.arg, inspect.Parameter.empty))
    out += [
        (a.arg, inspect.Parameter.empty if d is None else d)
        for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True)
    ]
    if args.kwarg:
        out.append((args.kwarg.arg, inspect.Parameter.empty))

    def literal(value: object) -> object:
        if value is inspect.Parameter.empty:
            return value
        try:
            return ast.literal_eval(value)  # type: ignore[arg-type]
        except ValueError:
            return ...

    return [(name, literal(default)) for name, default in out]


def _signature(obj: object) -> inspect.Signature:
    if inspect.isclass(obj):
        if obj.__init__ is object.__init__:  # type: ignore[misc]
            return inspect.Signature()  # no arguments (a base class)
        if obj.__new__ is not object.__new__:  # Tracker: __new__ takes *args for the rank's choice
            return inspect.signature(obj.__init__)  # type: ignore[misc]
    return inspect.signature(obj)  # type: ignore[arg-type]


SIGNED = [
    (module, name)
    for module, documented in sorted(MODULES.items())
    for name, line in sorted(documented.public.items())
    if "(" in line and (module, name) not in NEEDS_A_STACK
]


@pytest.mark.parametrize(("module", "name"), SIGNED)
def test_each_documented_signature_is_the_codes(module, name):
    documented = _documented_parameters(MODULES[module].public[name])
    obj = getattr(importlib.import_module(module), name)
    actual = [(p.name, p.default) for p in _signature(obj).parameters.values() if p.name != "self"]
    assert [n for n, _ in documented] == [n for n, _ in actual], (
        f"{module}.{name}: docs/API.md says ({', '.join(n for n, _ in documented)}), "
        f"the code takes ({', '.join(n for n, _ in actual)})"
    )
    for (param, said), (_, real) in zip(documented, actual, strict=True):
        if repr(real) == "<factory>":  # a dataclass field's default_factory: any documented default
            assert said is not inspect.Parameter.empty, (
                f"{module}.{name}({param}): docs/API.md gives no default"
            )
            continue
        if said is ... or real is inspect.Parameter.empty and said is inspect.Parameter.empty:
            continue
        if isinstance(real, (int, float, str, bool, tuple, type(None))) or said is inspect.Parameter.empty:
            assert said == real, f"{module}.{name}({param}=...): docs/API.md says {said!r}, the code {real!r}"


def test_the_checks_read_a_wrong_page_as_wrong(tmp_path):
    """A page that lists a name the code lacks, or lacks one the code exports, fails."""
    text = API.read_text()
    for wrong, message in [
        (text.replace("### `Limits`", "### `Limitz`", 1), r"lists \['Limitz'\] under cliptrack,"),
        (
            text.replace("### `Limits`", "#### Limits", 1),
            r"exports \['Limits'\], which docs/API.md does not list",
        ),
    ]:
        page = tmp_path / "API.md"
        page.write_text(wrong)
        modules, _ = _api(page)
        with pytest.raises(AssertionError, match=message):
            _check_exports(modules["cliptrack"])
    assert _documented_parameters("f(a, b=1, *, c=None, **kw)") == [
        ("a", inspect.Parameter.empty),
        ("b", 1),
        ("c", None),
        ("kw", inspect.Parameter.empty),
    ]
