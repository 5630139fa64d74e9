"""docs/design.md's layering: imports only point down, no module or unit imports in a cycle, no library module
imports a command line, and pgjax.core imports nothing else from pgjax and does no I/O."""
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


# command lines (python -m pgjax.NAME, and pgjax NAME through __main__; study: a study file's)
ENTRY_POINTS = {"__main__", "run", "eval", "compare", "demo", "plan", "study", "pairs"}
# the layers of docs/design.md, bottom up: a unit imports only from its own layer and those below
LAYERS = {"core": 0, "host_memory": 0, "errors": 0, "plugins": 0, "markdown": 0,  # arrays; process setup; tables
          "machine": 0, "checks": 0,                       # the machine a record names; ConfigError and the checks
          "theory": 1, "models": 1, "parallel": 1,                     # exact analysis; networks; devices
          "sample": 2, "tasks": 2, "agents": 2,                        # decoding; prompts and rewards; tools
          "rollout": 3,                                                # responses sampled and scored
          "evaluation": 4,                                             # held-out metrics and statistics
          "config": 5,                                                 # an experiment's sections, keys, files
          "train": 6,                                                  # the loop, checkpoints, run directory
          **dict.fromkeys(ENTRY_POINTS, 7)}
PACKAGE = CORE.parent


def _module(path: pathlib.Path) -> str:
    """``pgjax.a.b`` of ``pgjax/a/b.py`` (a package's ``__init__.py``: the package)."""
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """{module: the pgjax modules it imports} over every module of the package (``from pgjax.x import
    name`` counts as importing ``pgjax.x.name`` when that is a module, else ``pgjax.x``)."""
    modules = {_module(path): path for path in PACKAGE.rglob("*.py")}
    graph = {}
    for name, path in modules.items():
        targets = set()
        for node in ast.walk(ast.parse(path.read_text())):
            found = []
            if isinstance(node, ast.Import):
                found = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                found = [f"{node.module}.{alias.name}" if f"{node.module}.{alias.name}" in modules else node.module
                         for alias in node.names]
            targets |= {target for target in found if target in modules and target != name}
        graph[name] = targets
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one node (every import cycle), by Tarjan's algorithm."""
    index, low, stack, on_stack, found = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in graph.get(node, ()):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def _unit(module: str) -> str:
    """The layer unit of a module: ``pgjax/<package>/`` or ``pgjax/<module>.py``."""
    return module.split(".")[1] if module.count(".") else "__init__"


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycles_between_modules_or_units():
    graph = import_graph()
    assert len(graph) > 40
    assert not cycles(graph), f"import cycles between modules: {cycles(graph)}"
    units = {}
    for module, targets in graph.items():
        units.setdefault(_unit(module), set()).update(_unit(t) for t in targets if _unit(t) != _unit(module))
    units.pop("__init__", None)
    assert not cycles(units), f"import cycles between units: {cycles(units)}"


def test_the_library_never_imports_an_entry_point():
    """``run``, ``eval``, ``compare``, ``demo`` and ``plan`` are command lines: no library module imports
    one (the evaluation library is ``pgjax.evaluation.held_out``, importable without its command line)."""
    for module, targets in import_graph().items():
        if _unit(module) not in ENTRY_POINTS:
            entry = sorted(t for t in targets if _unit(t) in ENTRY_POINTS)
            assert not entry, f"{module} (library) imports the entry point(s) {entry}"


def test_imports_only_point_down_the_layers():
    package = CORE.parent
    files = sorted(package.rglob("*.py"))
    for path in files:
        layer = path.relative_to(package).parts[0].removesuffix(".py")
        if layer == "__init__" and path.parent == package:
            continue
        assert layer in LAYERS, f"{path}: add its layer to LAYERS (and docs/design.md)"
        for kind, name in _imports_and_calls(path):
            parts = name.split(".")
            if kind == "import" and parts[0] == "pgjax" and len(parts) > 1:
                assert LAYERS[parts[1]] <= LAYERS[layer], f"{path.relative_to(package)} imports {name}"


def test_the_layers_are_the_tree_and_the_design_doc():
    """Every unit of the package has a layer, every layer names a unit that exists, and docs/design.md's
    layer table lists each unit in its layer."""
    units = {path.name.removesuffix(".py") for path in PACKAGE.iterdir()
             if (path.suffix == ".py" or (path / "__init__.py").exists()) and path.name != "__init__.py"}
    assert units == set(LAYERS), f"units without a layer: {units - set(LAYERS)}; layers without a unit: " \
                                 f"{set(LAYERS) - units}"
    design = (PACKAGE.parent / "docs" / "design.md").read_text()
    table = design[design.index("<!-- layers -->"):design.index("<!-- /layers -->")]
    for layer in sorted(set(LAYERS.values())):
        row = next(line for line in table.splitlines() if line.startswith(f"| {layer} |"))
        for unit in (u for u, n in LAYERS.items() if n == layer and u not in ENTRY_POINTS):
            assert f"`pgjax/{unit}" in row, f"docs/design.md's layer {layer} row does not name {unit}"
