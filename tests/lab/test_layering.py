"""The layers import downwards only: the laboratory's tools (lab/) never import the studies built on them."""
import ast
import pathlib

import normlab

PACKAGE = pathlib.Path(normlab.__file__).parent


def _imports(path: pathlib.Path) -> set[str]:
    """Absolute names of the normlab modules ``path`` imports, at any depth (function-level imports too)."""
    package = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts[:-1])
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.rsplit(".", node.level - 1)[0] if node.level else ""
            module = ".".join(p for p in (base, node.module) if p)
            names |= {module} | {f"{module}.{a.name}" for a in node.names}
    return {n for n in names if n.startswith("normlab")}


def test_lab_never_imports_the_studies_or_the_cli():
    found = {f"{p.name} imports {n}" for p in (PACKAGE / "lab").glob("*.py") for n in _imports(p)
             if n.startswith(("normlab.studies", "normlab.cli"))}
    assert not found, sorted(found)


def test_the_resolution_of_relative_imports():
    lesson = _imports(PACKAGE / "lab" / "lesson.py")
    assert "normlab.norms.LayerNorm" in lesson and "normlab.batchnorm.MaskedBatchNorm" in lesson
    assert "normlab.lab.lesson.batch_dependence" in _imports(PACKAGE / "studies" / "lesson_stats.py")
