#!/usr/bin/env python
"""Import cycles and layering of the ``recallserve`` packages, from their source.

The graph: grimp (https://grimp.readthedocs.io) parses every import statement of the four
packages, at module top, inside functions and under ``TYPE_CHECKING`` alike, so a cycle hidden by
a function-level import still counts. Two kinds of edge are added to grimp's:

- ``from pkg import _sub`` imports ``pkg`` too, not only ``pkg._sub`` (grimp records the
  submodule alone): the statement runs ``pkg/__init__.py`` and reads the name from it;
- a package's lazy exports (``__getattr__ = lazy_exports(__name__, _LAZY)``, see
  :func:`recallserve.kernels.lazy_exports`) import the modules named in its ``_LAZY`` dict on first
  use: an import by string, invisible to a parser of import statements.

A cycle is a strongly connected component of more than one module (Tarjan's algorithm), listed
once however many circular paths it holds. Layers point down, ``deployments -> serve ->
memory_shards -> kernels``; Ray and the engines' runtimes are imported by ``deployments`` only.

Usage: ``python scripts/import_cycles.py`` prints each cycle and their count, then the
function-level imports of project modules per package; exit 1 when there is a cycle.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path

import grimp

ROOT = Path(__file__).resolve().parents[1]
#: The packages from the top layer down: a module may import only its own layer and the ones below.
LAYERS = ("recallserve.deployments", "recallserve.serve", "recallserve.memory_shards", "recallserve.kernels")
#: Third-party packages only ``recallserve.deployments`` may import: Ray and the engine runtimes
#: (the lower layers stay framework-free and run in-process under the unit tests).
DEPLOYMENTS_ONLY = ("ray", "vllm", "llama_cpp")

_FROM = re.compile(r"\s*from\s+(\.*)([\w.]*)\s+import\b")


#: Packages pyproject maps from a folder inside a layer (``package-dir``): grimp parses their files
#: under the folder's name and sees an import of the mapped name as one external node.
ALIASES = {"recallserve.client": "recallserve.serve.client"}
_NAMES = re.compile(r"\s*(?:from\s+([\w.]+)\s+import\s+([\w., ]+)|import\s+([\w.]+))")


def _alias_edges(graph: grimp.ImportGraph) -> Iterable[tuple[str, str]]:
    """``importer -> <folder's module>`` for each import of an :data:`ALIASES` name, so its cycles count."""
    for alias, module in ALIASES.items():
        if alias not in graph.modules:
            continue
        for importer in sorted(graph.find_modules_that_directly_import(alias)):
            for detail in graph.get_import_details(importer=importer, imported=alias):
                match = _NAMES.match(detail["line_contents"])
                name = (match.group(1) or match.group(3)) if match else alias
                targets = [name] + [f"{name}.{n.split(' as ')[0].strip()}" for n in (match.group(2) or "").split(",")
                                    if match and n.strip()]
                for target in targets:
                    real = module + target.removeprefix(alias)
                    if real in graph.modules and real != importer:
                        yield importer, real


def build_graph() -> grimp.ImportGraph:
    """The import graph of the four packages, third-party packages as single nodes, extra edges added."""
    graph = grimp.build_graph(*LAYERS, include_external_packages=True, cache_dir=None)
    for importer, imported in [*package_edges(graph), *_lazy_edges(graph), *_alias_edges(graph)]:
        graph.add_import(importer=importer, imported=imported)
    return graph


def _ours(module: str) -> bool:
    return module.startswith(tuple(f"{layer}." for layer in LAYERS)) or module in LAYERS


def _is_package(module: str) -> bool:
    return _source(module).name == "__init__.py"


def _source(module: str) -> Path:
    layer = next(layer for layer in LAYERS if module == layer or module.startswith(layer + "."))
    folder = ROOT / layer.removeprefix("recallserve.") / Path(*module.removeprefix(layer).lstrip(".").split("."))
    return folder / "__init__.py" if folder.is_dir() else folder.with_suffix(".py")


def package_edges(graph: grimp.ImportGraph) -> Iterable[tuple[str, str]]:
    """``importer -> pkg`` for every ``from pkg import sub`` (relative or absolute) grimp saw as ``-> pkg.sub``."""
    for importer in sorted(m for m in graph.modules if _ours(m)):
        for imported in graph.find_modules_directly_imported_by(importer):
            parent = imported.rpartition(".")[0]
            if not _ours(imported) or not _ours(parent) or parent == importer:
                continue
            for detail in graph.get_import_details(importer=importer, imported=imported):
                match = _FROM.match(detail["line_contents"])
                if match and _resolve(importer, match.group(1), match.group(2)) == parent:
                    yield importer, parent
                    break


def _resolve(importer: str, dots: str, name: str) -> str:
    """The absolute module of ``from <dots><name> import ...`` written in ``importer``."""
    if not dots:
        return name
    base = importer.split(".") if _is_package(importer) else importer.split(".")[:-1]
    base = base[: len(base) - (len(dots) - 1)]
    return ".".join(base + ([name] if name else []))


def lazy_exports(module: str) -> dict[str, str]:
    """``name -> module`` of the ``_LAZY`` dict a package hands to ``lazy_exports`` ({} when it has none)."""
    tree = ast.parse(_source(module).read_text())
    if not any(isinstance(n, ast.Call) and getattr(n.func, "id", None) == "lazy_exports" for n in ast.walk(tree)):
        return {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", None) == "_LAZY" for t in node.targets):
            # NOTE: literal_eval cannot read ``**dict.fromkeys(...)`` entries: evaluate the dict
            # expression with no names but ``dict`` (it is source of this repository, not input).
            return eval(compile(ast.Expression(node.value), str(_source(module)), "eval"), {"__builtins__": {"dict": dict}})
    raise ValueError(f"{module}: calls lazy_exports without a module-level _LAZY dict")


def _lazy_edges(graph: grimp.ImportGraph) -> Iterable[tuple[str, str]]:
    for module in sorted(m for m in graph.modules if _ours(m) and _is_package(m)):
        for target in sorted(set(lazy_exports(module).values())):
            yield module, target


def find_cycles(edges: Mapping[str, Iterable[str]]) -> list[list[str]]:
    """Strongly connected components of more than one node, each sorted, in sorted order.

    Tarjan's algorithm, iterative (no recursion limit on long chains): one depth-first pass;
    a node whose lowest reachable index on the stack is its own index roots a component.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for start in sorted(edges):
        if start in index:
            continue
        work = [(start, iter(sorted(edges[start])))]
        index[start] = low[start] = len(index)
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    return sorted(components)


def module_cycles(graph: grimp.ImportGraph) -> list[list[str]]:
    """The import cycles among the project's modules."""
    ours = sorted(m for m in graph.modules if _ours(m))
    return find_cycles({m: [i for i in graph.find_modules_directly_imported_by(m) if _ours(i)] for m in ours})


def upward_imports(graph: grimp.ImportGraph) -> list[str]:
    """``importer -> imported`` for every import of a higher layer's module (direct or through a chain)."""
    found = graph.find_illegal_dependencies_for_layers(layers=LAYERS)
    return sorted(f"{d.importer} -> {d.imported}: {' -> '.join(r.importer for r in d.routes)}" for d in found)


def misplaced_framework_imports(graph: grimp.ImportGraph) -> list[str]:
    """``module -> package`` for every import of a :data:`DEPLOYMENTS_ONLY` package outside ``deployments``."""
    return sorted(f"{m} -> {pkg}" for pkg in DEPLOYMENTS_ONLY if pkg in graph.modules
                  for m in graph.find_modules_that_directly_import(pkg) if not m.startswith(LAYERS[0] + "."))


def function_level_imports(folder: Path) -> Counter[str]:
    """Per file of ``folder``: import statements of ``recallserve`` modules inside a function body."""
    counts: Counter[str] = Counter()
    for path in sorted(folder.rglob("*.py")):
        seen: set[int] = set()
        for func in ast.walk(ast.parse(path.read_text())):
            if not isinstance(func, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            for node in ast.walk(func):
                if id(node) in seen or not isinstance(node, (ast.Import, ast.ImportFrom)):
                    continue
                seen.add(id(node))
                names = [a.name for a in node.names] if isinstance(node, ast.Import) else [node.module or ""]
                if (isinstance(node, ast.ImportFrom) and node.level) or any(n.startswith("recallserve") for n in names):
                    counts[path.relative_to(ROOT).as_posix()] += 1
    return counts


def main() -> int:
    """Print the cycles, their count and the function-level project imports; exit 1 on a cycle."""
    graph = build_graph()
    cycles = module_cycles(graph)
    for cycle in cycles:
        print(" <-> ".join(cycle))
    print(f"import cycles: {len(cycles)}")
    for line in upward_imports(graph) + misplaced_framework_imports(graph):
        print(f"layering: {line}")
    for layer in LAYERS:
        folder = layer.removeprefix("recallserve.")
        print(f"function-level imports of project modules in {folder}/: {sum(function_level_imports(ROOT / folder).values())}")
    return 1 if cycles else 0


if __name__ == "__main__":
    sys.exit(main())
