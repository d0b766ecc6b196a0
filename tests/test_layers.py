"""The house of docs/architecture.md holds: no import runs up a layer, none forms a cycle, and every
module of the package has its place in a layer (a new one must be given one)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp
import pytest
from importlinter.application.use_cases import lint_imports
from importlinter.configuration import configure

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"


@pytest.fixture(scope="module")
def graph() -> grimp.ImportGraph:
    return grimp.build_graph("gpuwarden")


def _placed() -> list[str]:
    """Every module the layers contract names ("gpuwarden.x"), top layer first."""
    contracts = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]["contracts"]
    (layers,) = [c["layers"] for c in contracts if c["type"] == "layers"]
    return [name.strip() for layer in layers for name in layer.replace(":", "|").split("|") if name.strip()]


def test_no_import_runs_up_a_layer() -> None:
    configure()  # import-linter's readers and graph builder, as its command line sets them
    assert lint_imports(config_filename=str(PYPROJECT), cache_dir=None, no_logo=True)


def test_no_import_cycle(graph: grimp.ImportGraph) -> None:
    cycles = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back:
                cycles.append(" -> ".join((importer, *back)))
    assert not cycles, "\n".join(cycles)


def test_every_module_has_a_layer(graph: grimp.ImportGraph) -> None:
    placed = set(_placed())
    top = {".".join(m.split(".")[:2]) for m in graph.modules if m != "gpuwarden"}
    assert top - placed == set(), "give these a layer in pyproject.toml and docs/architecture.md"
    assert placed - top == set(), "layers name modules that no longer exist"


def test_architecture_doc_names_every_layer() -> None:
    doc = (PYPROJECT.parent / "docs" / "architecture.md").read_text()
    missing = [name for name in (m.removeprefix("gpuwarden.") for m in _placed()) if f"`{name}" not in doc]
    assert not missing, f"docs/architecture.md does not name: {missing}"
