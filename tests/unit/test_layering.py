"""The module graph of ``recallserve``: no import cycle, layers pointing down, Ray only in ``deployments``.

The graph is built from the source by ``scripts/import_cycles.py`` (grimp: every import statement,
function-level ones included, plus lazy exports and ``from pkg import sub``); the same script prints
the cycles for a person (``python scripts/import_cycles.py``).
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import grimp
import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.append(str(ROOT))

from scripts.import_cycles import (  # noqa: E402
    build_graph,
    find_cycles,
    lazy_exports,
    misplaced_framework_imports,
    module_cycles,
    package_edges,
    upward_imports,
)


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return build_graph()


def test_no_module_is_in_an_import_cycle(graph: grimp.ImportGraph) -> None:
    cycles = [" <-> ".join(cycle) for cycle in module_cycles(graph)]
    assert cycles == [], "put each shared concept in the lower module:\n" + "\n".join(cycles)


def test_layers_point_down(graph: grimp.ImportGraph) -> None:
    """deployments -> serve -> memory_shards -> kernels: no chain of imports climbs a layer."""
    assert upward_imports(graph) == []


def test_ray_and_the_engine_runtimes_are_imported_by_deployments_only(graph: grimp.ImportGraph) -> None:
    assert "ray" in graph.modules and graph.find_modules_that_directly_import("ray")
    assert misplaced_framework_imports(graph) == []


def test_the_graph_counts_function_level_and_lazy_imports(graph: grimp.ImportGraph) -> None:
    # NOTE: the runner imports Ray only inside its functions (so that `recallserve --help` stays light).
    details = graph.get_import_details(importer="recallserve.deployments.runner", imported="ray")
    lines = (ROOT / "deployments" / "runner.py").read_text().splitlines()
    assert details and all(lines[d["line_number"] - 1].startswith(" ") for d in details)
    assert graph.direct_import_exists(importer="recallserve.memory_shards",
                                      imported="recallserve.memory_shards.coordinator")


def test_from_package_import_submodule_also_imports_the_package() -> None:
    graph = grimp.ImportGraph()
    graph.add_import(importer="recallserve.serve.x.a", imported="recallserve.serve.x._b", line_number=3,
                     line_contents="from recallserve.serve.x import _b")
    graph.add_import(importer="recallserve.serve.x.a", imported="recallserve.serve.x._c", line_number=4,
                     line_contents="from recallserve.serve.x._c import name")
    assert list(package_edges(graph)) == [("recallserve.serve.x.a", "recallserve.serve.x")]


def test_find_cycles_lists_each_strongly_connected_component_once() -> None:
    edges = {"a": ["b"], "b": ["c", "d"], "c": ["a"], "d": ["e"], "e": ["d"], "f": ["a"], "g": []}
    assert find_cycles(edges) == [["a", "b", "c"], ["d", "e"]]
    assert find_cycles({"a": ["b"], "b": []}) == []


def _top_level_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return names


@pytest.mark.parametrize("package", ["recallserve.kernels", "recallserve.memory_shards", "recallserve.serve.experience",
                                     "recallserve.deployments.jobs"])
def test_every_lazy_export_names_a_project_module_that_defines_it(graph: grimp.ImportGraph, package: str) -> None:
    """A lazy export is an import by string: a wrong module path fails only when the name is first used."""
    lazy = lazy_exports(package)
    assert lazy
    wrong = []
    for name, module in lazy.items():
        if module not in graph.modules or not module.startswith("recallserve."):
            wrong.append(f"{name}: {module} is not a recallserve module")
            continue
        path = ROOT / Path(*module.split(".")[1:])
        source = path / "__init__.py" if path.is_dir() else path.with_suffix(".py")
        # NOTE: a package may pass the name on from its own lazy exports (memory_shards -> kernels).
        if name not in _top_level_names(source) and name not in lazy_exports(module):
            wrong.append(f"{name}: not defined at the top of {module}")
    assert wrong == []
