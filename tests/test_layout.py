"""docs/design.md's layering: imports only point down, and pgjax.core imports nothing else from pgjax and does
no I/O."""
import ast
import pathlib

CORE = pathlib.Path(__file__).parent.parent / "pgjax" / "core"
IO_CALLS = {"open", "print", "input", "save", "savez", "load", "loadtxt", "write", "read", "dump",
            "system", "urlopen", "callback", "debug_callback", "io_callback", "pure_callback"}


def _imports_and_calls(path):
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (("import", alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            yield "import", node.module or ""
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            yield "call", node.func.id
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            yield "call", node.func.attr


def test_core_imports_only_core_and_does_no_io():
    files = sorted(CORE.glob("*.py"))
    assert len(files) >= 7
    for path in files:
        for kind, name in _imports_and_calls(path):
            if kind == "import":
                assert not name.startswith("pgjax") or name.startswith("pgjax.core"), f"{path.name} imports {name}"
                assert name.split(".")[0] not in {"os", "io", "sys", "pathlib", "requests", "urllib", "pickle"}, \
                    f"{path.name} imports {name}"
            else:
                assert name not in IO_CALLS, f"{path.name} calls {name}()"


LAYERS = {"core": 0, "host_memory": 0, "theory": 1, "models": 1, "parallel": 1, "sample": 2, "rewards": 2, "train": 3, "eval": 3,
          "run": 4, "compare": 4, "demo": 4, "plan": 4}


def test_imports_only_point_down_the_layers():
    package = CORE.parent
    files = sorted(package.rglob("*.py"))
    for path in files:
        layer = path.relative_to(package).parts[0].removesuffix(".py")
        if layer == "__init__":
            continue
        assert layer in LAYERS, f"{path}: add its layer to LAYERS (and docs/design.md)"
        for kind, name in _imports_and_calls(path):
            parts = name.split(".")
            if kind == "import" and parts[0] == "pgjax" and len(parts) > 1:
                assert LAYERS[parts[1]] <= LAYERS[layer], f"{path.relative_to(package)} imports {name}"
