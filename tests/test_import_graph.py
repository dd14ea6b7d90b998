"""The import graph of the project's own modules, read from the source (ast), imports inside functions
included and `if TYPE_CHECKING:` blocks left out (they never run): no cycles, a pure credit core that
writes no table (its I/O adapter, pipeline/credit_io.py, does), and the pipeline independent of the
trainer."""

from __future__ import annotations

import ast
import graphlib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("pipeline", "training", "workflows")


def _modules() -> dict[str, Path]:
    out = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


MODULES = _modules()


def _runtime_imports(tree: ast.AST) -> list[str]:
    """Dotted names imported where the code runs: `from X import Y` gives X.Y when that is a module of
    ours (importing a submodule), else X."""
    names: list[str] = []

    def visit(node: ast.AST) -> None:
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.Import):
            names.extend(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.extend(f"{node.module}.{a.name}" if f"{node.module}.{a.name}" in MODULES else node.module
                         for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(tree)
    return names


def _project_module(name: str) -> str | None:
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


IMPORTS = {name: _runtime_imports(ast.parse(path.read_text())) for name, path in MODULES.items()}


def _edges(name: str) -> set[str]:
    """The project's modules that `name` imports at run time."""
    return {target for imported in IMPORTS[name] if (target := _project_module(imported))} - {name}


def test_there_are_no_import_cycles():
    graph = graphlib.TopologicalSorter({name: _edges(name) for name in MODULES})
    try:
        graph.prepare()
    except graphlib.CycleError as e:
        pytest.fail(f"import cycle: {' -> '.join(e.args[1])}")


CREDIT_CORE = sorted(m for m in MODULES if m == "pipeline.credit" or m.startswith("pipeline.credit."))


# the core and its I/O adapter, pipeline.credit_io
@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("pipeline.credit")))
def test_the_credit_core_imports_no_engine_and_no_trainer(module):
    heavy = ("apache_beam", "torch", "duckdb", "transformers", "deepspeed", "ray", "openrlhf", "training",
             "workflows")
    bad = sorted({i for i in IMPORTS[module] if i.split(".")[0] in heavy})
    assert not bad, f"{module} imports {bad}"


@pytest.mark.parametrize("module", CREDIT_CORE)
def test_the_credit_core_assembles_no_table(module):
    """Tables are assembled in the I/O adapter (pipeline/credit_io.py): the core imports no pyarrow, and from
    the data contract (pipeline.schema) only `content_id`, the one id function (the ids it computes are the
    tables'), so no column name, row type or schema reaches it."""
    tree = ast.parse(MODULES[module].read_text())
    assert "pyarrow" not in {i.split(".")[0] for i in _runtime_imports(tree)}, f"{module} imports pyarrow"
    taken = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module == "pipeline.schema":
            taken |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module == "pipeline":
            taken |= {f"pipeline.{a.name}" for a in node.names if a.name == "schema"}
        elif isinstance(node, ast.Import):
            taken |= {a.name for a in node.names if a.name.startswith("pipeline.schema")}
    assert taken <= {"content_id"}, f"{module} takes {sorted(taken - {'content_id'})} from pipeline.schema"


@pytest.mark.parametrize("module", sorted(m for m in MODULES if m.startswith("pipeline")))
def test_the_pipeline_imports_nothing_from_the_trainer(module):
    bad = sorted({i for i in IMPORTS[module] if i.split(".")[0] == "training"})
    assert not bad, f"{module} imports {bad}"


def test_the_graph_reader_sees_real_imports():
    """The checks above would pass vacuously on an empty graph: the reader finds known edges."""
    assert "pipeline.transforms.credit" in _edges("pipeline.run")
    assert "pipeline.sandbox._worker" in _edges("pipeline.sandbox.pool")  # from a package import a submodule
    assert "pipeline.credit.estimators" in _edges("pipeline.credit.did")
    assert "pipeline.credit.settings" not in _edges("pipeline.credit.did")  # a TYPE_CHECKING import only
    assert "training.sft" in _edges("workflows.sft_cmd")
    assert "pipeline.credit.batch" in CREDIT_CORE and "pipeline.credit_io" not in CREDIT_CORE
    assert "pyarrow" in IMPORTS["pipeline.credit_io"] and "pipeline.schema" in _edges("pipeline.credit_io")
