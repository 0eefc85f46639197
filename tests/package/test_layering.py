"""The package's import graph: no circle between modules, and packages import one way (docs/architecture.md)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2] / "lightning_dataperf"

#: Low to high: a package imports only from packages before it (the top-level modules are below them all).
LAYERS = [
    "telemetry",
    "loader",
    "transfer",
    "decode",
    "timing",
    "diagnosis",
    "autotune",
    "report",
    "callback",
    "datamodule",
]
TOP_LEVEL = {"tags", "batches", "_lightning_hooks", "_lazy", "_registration", "_records"}


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module -> the package modules it imports anywhere (module level, functions and ``TYPE_CHECKING``)."""
    modules = {_module_name(path): path for path in ROOT.rglob("*.py")}
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        edges = set()
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("lightning_dataperf"):
                targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
            elif isinstance(node, ast.Import):
                targets = [alias.name for alias in node.names if alias.name.startswith("lightning_dataperf")]
            else:
                continue
            # `from pkg import module` names a module; `from pkg.module import name` names its module
            edges |= {target for target in targets[:1] if target in modules} or {t for t in targets if t in modules}
        graph[name] = edges - {name}
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    state: dict[str, int] = {}
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node], _ = 1, stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt) :], nxt]
            if nxt not in state and (found := visit(nxt)):
                return found
        state[node], _ = 2, stack.pop()
        return None

    for node in sorted(graph):
        if node not in state and (found := visit(node)):
            return found
    return None


def _package(module: str) -> str | None:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LAYERS else None


def test_no_module_imports_in_a_circle():
    assert _cycle(import_graph()) is None


def test_packages_import_one_way_in_the_stated_layer_order():
    wrong = []
    for module, edges in import_graph().items():
        source = _package(module)
        for target in edges:
            dest = _package(target)
            if source is None and module.split(".")[-1] in TOP_LEVEL and dest is not None:
                wrong.append(f"{module} -> {target} (a shared top-level module imports a package)")
            elif source and dest and source != dest and LAYERS.index(dest) > LAYERS.index(source):
                wrong.append(f"{module} -> {target} ({source} is below {dest})")
    assert not wrong, "\n".join(sorted(wrong))


def test_the_check_sees_a_circle_and_a_layer_broken():
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


@pytest.mark.parametrize("limit", [400])
def test_no_module_is_over_400_lines_and_no_folder_over_20_modules(limit):
    long = [
        f"{path.relative_to(ROOT)}: {n}"
        for path in ROOT.rglob("*.py")
        if (n := len(path.read_text().splitlines())) > limit
    ]
    assert not long, long
    crowded = [str(d) for d in {p.parent for p in ROOT.rglob("*.py")} if len(list(d.glob("*.py"))) > 20]
    assert not crowded, crowded


# ---------------------------------------------------------------- hidden dependencies, read from the source
#: The one module that may touch private PyTorch/Lightning members, and the one that may swap a class.
HOOKS_MODULE, WRAPPING_MODULE = "_lightning_hooks.py", "loader/wrapping.py"
_REFLECTION = {"getattr", "setattr", "hasattr", "delattr", "__setattr__"}


def _private_member_names() -> set[str]:
    """Private members of the PyTorch and Lightning objects the package handles (loaders, their iterators,
    storages, trainer, loops, strategies, loggers), by looking at them."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.loggers import TensorBoardLogger
    from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy
    from torch.utils.data import DataLoader, dataloader

    trainer = pl.Trainer(logger=False, enable_checkpointing=False, enable_progress_bar=False)
    objects = [DataLoader(range(2)), dataloader._MultiProcessingDataLoaderIter, iter(DataLoader(range(2)))]
    objects += [torch.UntypedStorage, torch.cuda, trainer, trainer.fit_loop, trainer.fit_loop.epoch_loop]
    objects += [trainer.validate_loop, trainer.test_loop, trainer.predict_loop, SingleDeviceStrategy, DDPStrategy]
    objects += [TensorBoardLogger, pl.LightningModule, pl.LightningDataModule]
    return {name for item in objects for name in dir(item) if name.startswith("_") and not name.endswith("__")}


def _rooted_at_torch_or_lightning(tree: ast.AST) -> set[str]:
    """Names this module binds to PyTorch or Lightning (``import torch``, ``from torch.utils.data import X``)."""
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in {"torch", "lightning"}:
                    names.add(alias.asname or alias.name.split(".")[0])
        elif isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in {"torch", "lightning"}:
            names |= {alias.asname or alias.name for alias in node.names}
    return names


def private_uses(source: str, private: set[str]) -> list[str]:
    """Where ``source`` reaches a private PyTorch/Lightning member: through a torch/lightning name
    (``torch.cuda._sleep``), an import (``from torch.x._utils import``), or a known private member of their
    objects on anything but ``self``/``cls`` (``loader._iterator``, ``getattr(it, "_shutdown_workers")``)."""
    tree = ast.parse(source)
    roots = _rooted_at_torch_or_lightning(tree)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] in {"torch", "lightning"}:
            parts = [*node.module.split("."), *(alias.name for alias in node.names)]  # type: ignore[union-attr]
            found += [f"line {node.lineno}: from {node.module} import _..." for p in parts[:1] if _private(parts)]
        elif isinstance(node, ast.Attribute) and _private([node.attr]):
            chain, base = [node.attr], node.value
            while isinstance(base, ast.Attribute):
                chain.append(base.attr)
                base = base.value
            receiver = base.id if isinstance(base, ast.Name) else ""
            if receiver in roots or (node.attr in private and not (receiver in {"self", "cls"} and len(chain) == 1)):
                found.append(f"line {node.lineno}: .{node.attr}")
        elif isinstance(node, ast.Call) and len(node.args) >= 2 and isinstance(node.args[1], ast.Constant):
            name = getattr(node.func, "id", getattr(node.func, "attr", ""))
            if name in _REFLECTION and node.args[1].value in private:
                found.append(f"line {node.lineno}: {name}(..., {node.args[1].value!r})")
    return found


def _private(parts: list[str]) -> bool:
    return any(part.startswith("_") and not part.endswith("__") for part in parts)


def _reflects(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and getattr(node.func, "attr", getattr(node.func, "id", "")) in _REFLECTION


def class_swaps(source: str) -> list[str]:
    """Where ``source`` assigns an object's ``__class__``."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else []
        found += [f"line {node.lineno}" for t in targets if isinstance(t, ast.Attribute) and t.attr == "__class__"]
        if _reflects(node) and any(isinstance(a, ast.Constant) and a.value == "__class__" for a in node.args):  # type: ignore[attr-defined]
            found.append(f"line {node.lineno}")
    return found


def init_patches(source: str) -> list[str]:
    """Where ``source`` replaces the ``__init__`` of a class it imports from outside the package (a process-wide
    patch: every thread's objects go through it); a decorator refining a record of its own is not one."""
    tree = ast.parse(source)
    foreign = {
        (alias.asname or alias.name).split(".")[0]
        for node in ast.walk(tree)
        if isinstance(node, (ast.Import, ast.ImportFrom))
        and not (getattr(node, "module", None) or "").startswith("lightning_dataperf")
        and not (isinstance(node, ast.ImportFrom) and node.level)
        for alias in node.names
    }

    def imported(node: ast.AST) -> bool:
        while isinstance(node, ast.Attribute):
            node = node.value
        return isinstance(node, ast.Name) and node.id in foreign

    found = []
    for node in ast.walk(tree):
        targets = node.targets if isinstance(node, ast.Assign) else []
        found += [
            f"line {node.lineno}"
            for t in targets
            if isinstance(t, ast.Attribute) and t.attr == "__init__" and imported(t.value)
        ]
        if (
            _reflects(node)
            and any(isinstance(a, ast.Constant) and a.value == "__init__" for a in node.args[1:2])  # type: ignore[attr-defined]
            and imported(node.args[0])  # type: ignore[attr-defined]
        ):
            found.append(f"line {node.lineno}")
    return found


def _violations(root: Path, check, allowed: str | None) -> list[str]:
    return [
        f"{path.relative_to(root)} {where}"
        for path in sorted(root.rglob("*.py"))
        if str(path.relative_to(root)) != allowed
        for where in check(path.read_text())
    ]


def test_no_private_torch_or_lightning_member_outside_the_hooks_module():
    private = _private_member_names()
    wrong = _violations(ROOT, lambda source: private_uses(source, private), HOOKS_MODULE)
    assert not wrong, f"move these into lightning_dataperf/{HOOKS_MODULE}, with a contract test:\n" + "\n".join(wrong)


def test_no_class_swap_outside_the_wrapping_module():
    wrong = _violations(ROOT, class_swaps, WRAPPING_MODULE)
    assert not wrong, f"wrap through lightning_dataperf/{WRAPPING_MODULE}:\n" + "\n".join(wrong)


def test_no_process_wide_patch_of_a_constructor():
    wrong = _violations(ROOT, init_patches, None)
    assert not wrong, "\n".join(wrong)


def test_the_source_checks_see_what_they_forbid():
    private = {"_iterator", "_shutdown_workers"}
    source = (
        "import torch\nfrom torch.utils.data._utils import collate\n"
        "torch.cuda._sleep(1)\nloader._iterator = None\ngetattr(it, '_shutdown_workers', None)\n"
        "self._iterator = 1\nself._own.x = 2\n"
    )
    assert len(private_uses(source, private)) == 4  # not the module's own self._iterator, self._own
    assert class_swaps("loader.__class__ = Sub\nobject.__setattr__(d, '__class__', Sub)\n") == ["line 1", "line 2"]
    patch = "from torch.utils.data import DataLoader\nDataLoader.__init__ = init\nsetattr(DataLoader, '__init__', f)\n"
    assert init_patches(patch) == ["line 2", "line 3"]
    assert init_patches("import torch\ntorch.utils.data.DataLoader.__init__ = init\n") == ["line 2"]
    assert not init_patches("def refine(cls):\n    cls.__init__ = checked\n    return cls\n")
    assert not init_patches("def __init__(self):\n    super().__init__()\n")
