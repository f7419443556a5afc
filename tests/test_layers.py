"""The layering docs/architecture.md draws, read from the code itself with Python's
`ast`: every import in src/ (those inside functions too) goes from a layer to a lower one or
within its own, and no modules import each other in a circle."""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
# top to bottom: each layer may import only from the layers after it (and from itself)
LAYERS = [
    ("cli",),
    ("config",),
    ("hydra_plugins",),  # gptlab's Optuna sweeper: built by config's schemas, uses sweep
    ("sweep",),
    ("training",),
    ("run",),
    ("data", "model"),
    ("errors", "exits", "files", "noise", "process", "reader", "__init__"),  # the bottom
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def layer_of(module: str) -> int | None:
    """The layer of a gptlab module: by its subpackage (gptlab.<sub>...), hydra_plugins whole."""
    parts = module.split(".")
    name = "hydra_plugins" if parts[0] == "hydra_plugins" else (parts[1:2] or ["__init__"])[0]
    if parts[0] not in ("gptlab", "hydra_plugins"):
        return None
    return next(i for i, layer in enumerate(LAYERS) if name in layer)


def imports(path: Path) -> set[str]:
    """The gptlab modules a file imports, anywhere in it."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    modules = {module_name(p) for p in SRC.rglob("*.py")}
    return {name for name in found if name in modules}


def graph() -> dict[str, set[str]]:
    return {module_name(path): imports(path) - {module_name(path)} for path in SRC.rglob("*.py")}


def test_every_module_has_a_layer():
    assert all(layer_of(module) is not None for module in graph()), sorted(graph())


def test_no_import_runs_back_up_the_layers():
    upward = [
        f"{module} -> {target}"
        for module, targets in graph().items()
        for target in targets
        if layer_of(target) < layer_of(module)
    ]
    assert upward == [], "imports from a lower layer to a higher one:\n" + "\n".join(upward)


def test_no_modules_import_each_other_in_a_circle():
    edges = graph()
    state: dict[str, str] = {}
    circles = []

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(edges[module]):
            if state.get(target) == "open":
                circles.append(" -> ".join([*path[path.index(target) :], target]))
            elif target not in state:
                visit(target, [*path, target])
        state[module] = "done"

    for module in sorted(edges):
        if module not in state:
            visit(module, [module])
    assert circles == [], "\n".join(circles)


def test_the_check_sees_an_upward_import(tmp_path, monkeypatch):
    """The rule is not vacuous: a module of `run` importing `training` is caught."""
    package = tmp_path / "gptlab"
    (package / "run").mkdir(parents=True)
    (package / "training").mkdir()
    (package / "run" / "bad.py").write_text("def f():\n    from gptlab.training import x\n")
    (package / "training" / "x.py").write_text("")
    monkeypatch.setattr(__import__(__name__), "SRC", tmp_path)
    assert "gptlab.training.x" in imports(package / "run" / "bad.py")
    assert layer_of("gptlab.training.x") < layer_of("gptlab.run.bad")


def test_no_module_is_over_300_lines():
    """One concern a file: a module past 300 lines holds two (split it where they part)."""
    long = {
        str(p.relative_to(SRC)): n
        for p in SRC.rglob("*.py")
        if (n := len(p.read_text().splitlines())) > 300
    }
    assert not long, f"split these modules: {long}"
