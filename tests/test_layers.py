"""Layers you can see: every import of the product's Python code goes downward (or within its layer).

crucible.core < graphs < pipelines < serve < tools (qualification, conformance grids, the transformers
reference, MAX's CLI) < benchmarks < crucible.cli. Imports inside functions count too. The Mojo kernels
sit under all of them and import no Python.
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
LAYERS = [  # (module prefix, rank); the longest matching prefix decides
    ("crucible.core", 0), ("crucible", 0),  # crucible/__init__.py holds only the version
    ("graphs", 1), ("pipelines", 2), ("serve", 3),
    ("crucible.qualify", 4), ("crucible.conformance", 4), ("crucible.reference", 4), ("crucible.export", 4),
    ("crucible.max_cli", 4), ("crucible.parity_reference", 4),
    ("benchmarks", 5), ("crucible.cli", 6),
]
PRODUCT = ("crucible", "graphs", "pipelines", "serve", "benchmarks")


def rank(module: str) -> int | None:
    best = None
    for prefix, r in LAYERS:
        if module == prefix or module.startswith(prefix + "."):
            if best is None or len(prefix) > len(best[0]):
                best = (prefix, r)
    return None if best is None else best[1]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> list[tuple[int, str]]:
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            found += [(node.lineno, f"{node.module}.{a.name}") for a in node.names]
    return found


def violations() -> list[str]:
    bad = []
    for top in PRODUCT:
        for path in sorted((ROOT / top).rglob("*.py")):
            if "results" in path.parts:
                continue
            mod = module_name(path)
            own = rank(mod)
            assert own is not None, mod
            for line, target in imports(path):
                if target.split(".")[0] not in PRODUCT or target.startswith("tests"):
                    continue
                r = rank(target)
                if r is not None and r > own:
                    bad.append(f"{path.relative_to(ROOT)}:{line} ({mod}, layer {own}) imports {target} (layer {r})")
    return bad


def test_imports_go_downward() -> None:
    assert violations() == []


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch) -> None:
    """Control: a graphs module importing serve is reported."""
    probe = ROOT / "graphs" / "_layer_probe.py"
    probe.write_text("def f():\n    from serve.app import create_app\n")
    try:
        assert any("_layer_probe" in v and "serve.app" in v for v in violations())
    finally:
        probe.unlink()


def test_fixtures_live_with_the_tests() -> None:
    assert not (ROOT / "crucible" / "testing").exists()
    assert (ROOT / "tests" / "support" / "tiny_models.py").is_file()
