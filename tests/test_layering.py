"""The layers of sparsefill, lowest first (``docs/architecture.md``)::

    torch patches < kernels < data class < autograd < constructors < compile < op rules < features
        < entry points

A module imports only from its own layer and the layers below, counting every ``import`` in the
file: at module level, inside functions, under ``TYPE_CHECKING``.  The data class reaches the layers
above through one seam, its hook table (``sparsefill._tensor.tensor.HOOKS``), which they fill when
they load: an import downward, like every other.
"""

import ast
import pathlib
import shutil

import pytest

import sparsefill

SRC = pathlib.Path(sparsefill.__file__).parent

LAYERS = (
    ("torch patches", ("sparsefill._torch_compat",)),
    ("kernels", ("sparsefill._kernels",)),
    ("data class", ("sparsefill._tensor",)),
    ("autograd", ("sparsefill._autograd",)),
    ("constructors", ("sparsefill._creation",)),
    ("compile", ("sparsefill._compile",)),
    ("op rules", ("sparsefill.ops",)),
    (
        "features",
        (
            "sparsefill.masked",
            "sparsefill.segment",
            "sparsefill.distributed",
            "sparsefill.nn",
            "sparsefill.data",
            "sparsefill._explain",
        ),
    ),
    (
        "entry points",
        ("sparsefill.__main__", "sparsefill.tour", "sparsefill.bench", "sparsefill.benchmarks"),
    ),
)


def layer_of(module: str) -> int:
    """The index in :data:`LAYERS` of ``module`` (the package ``sparsefill`` itself: the top)."""
    if module == "sparsefill":
        return len(LAYERS) - 1
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS")


def module_name(path: pathlib.Path, root: pathlib.Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: pathlib.Path, root: pathlib.Path):
    """``(line, imported module)`` for every import of a sparsefill module anywhere in the file,
    relative imports resolved; ``from P import name`` counts as ``P.name`` where that is a module."""
    me = module_name(path, root)
    package = me if path.name == "__init__.py" else me.rpartition(".")[0]
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(max(node.level - 1, 0)):
                base = base.rpartition(".")[0]
            module = ".".join(p for p in ((base if node.level else ""), node.module or "") if p)
            names = [_submodule_or(module, a.name, root) for a in node.names]
        else:
            continue
        for name in names:
            if name == "sparsefill" or name.startswith("sparsefill."):
                yield node.lineno, name


def _submodule_or(module: str, name: str, root: pathlib.Path) -> str:
    candidate = pathlib.Path(root.parent, *f"{module}.{name}".split("."))
    is_module = candidate.with_suffix(".py").exists() or (candidate / "__init__.py").exists()
    return f"{module}.{name}" if is_module else module


def upward_imports(root: pathlib.Path) -> list:
    """Every import from a lower layer to a higher one in the package at ``root``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        me = module_name(path, root)
        for line, target in imports(path, root):
            if layer_of(target) > layer_of(me):
                rel = path.relative_to(root.parent)
                out.append(
                    f"{rel}:{line}: {me} ({LAYERS[layer_of(me)][0]}) imports {target} "
                    f"({LAYERS[layer_of(target)][0]})"
                )
    return out


def test_every_module_is_in_a_layer():
    for path in SRC.rglob("*.py"):
        layer_of(module_name(path, SRC))


def test_no_import_goes_up_a_layer():
    assert upward_imports(SRC) == []


def test_a_planted_upward_import_is_found(tmp_path):
    """The check sees an import inside a function body of the lowest layer."""
    root = tmp_path / "sparsefill"
    shutil.copytree(SRC, root, ignore=shutil.ignore_patterns("__pycache__"))
    kernel = root / "_kernels" / "index.py"
    kernel.write_text(
        kernel.read_text() + "\n\ndef _planted():\n    from sparsefill.ops import registry\n"
    )
    found = upward_imports(root)
    assert len(found) == 1 and "_kernels/index.py" in found[0], found
    assert "imports sparsefill.ops.registry (op rules)" in found[0], found


@pytest.mark.parametrize(
    "module",
    [
        "sparsefill._kernels.grouping",
        "sparsefill._kernels.reducer",
        "sparsefill._kernels.combine",
        "sparsefill._kernels.accurate_sum",
        "sparsefill._kernels.selection",
        "sparsefill._kernels.engine",
    ],
)
def test_reduction_kernels_know_no_sparse_tensor(module):
    """The grouping, the reducer protocol and the engine boundary work on tensors only; the grouping
    sits below the protocol and the engines (it imports neither)."""
    path = SRC.joinpath(*module.split(".")[1:]).with_suffix(".py")
    mods = {target for _, target in imports(path, SRC)}
    assert all(m.startswith("sparsefill._kernels") for m in mods), mods
    if module.endswith("grouping"):
        protocol = ("reducer", "combine", "accurate_sum", "selection", "engine")
        assert not mods & {f"sparsefill._kernels.{m}" for m in protocol}, mods


@pytest.mark.parametrize("name", ["_schema.py", "_writes.py", "fallback.py"])
def test_lower_ops_modules_import_no_handler(name):
    ops = {m for _, m in imports(SRC / "ops" / name, SRC) if m.startswith("sparsefill.ops")}
    assert ops <= {"sparsefill.ops._schema", "sparsefill.ops._writes"}, ops


def test_the_hook_table_is_filled():
    from sparsefill._tensor.tensor import HOOKS
    from sparsefill.ops import registry, views

    assert HOOKS.dispatch is registry.dispatch
    assert HOOKS.sync is views.sync and HOOKS.track is views.track
    assert HOOKS.write_through is views.write_through
    missing = [name for name in HOOKS.ENTRIES if getattr(HOOKS, name) is None]
    assert missing == [], missing
