"""The code keeps the layers ARCHITECTURE.md draws: import-linter's contracts (in
pyproject.toml), ruff, and public names only across layers, run by the suite so
that CI fails on a wrong import."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "pullback"


def _run(*args: str) -> subprocess.CompletedProcess:
    # cwd=ROOT puts this checkout's `pullback` first, whichever copy pip installed.
    return subprocess.run([sys.executable, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600)


def test_imports_follow_the_layer_table() -> None:
    done = _run("-c", "from importlinter.cli import lint_imports_command as c; c()",
                "--no-cache")
    assert done.returncode == 0, done.stdout + done.stderr


def test_ruff_is_clean() -> None:
    done = _run("-m", "ruff", "check", "pullback", "tests")
    assert done.returncode == 0, done.stdout + done.stderr


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _layer(module: str) -> str:
    """`pullback.tensor.eager` -> `pullback.tensor`: the top-level part is the layer."""
    return ".".join(module.split(".")[:2])


def _imported_from(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    base = module.split(".") if is_package else module.split(".")[:-1]
    base = base[:len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def _private(name: str) -> bool:
    return name.startswith("_") and not name.startswith("__")


def _private_names_across_layers(path: Path) -> list[str]:
    """`from <another layer> import _name`, and `module._name` on a module of another layer."""
    module = _module_name(path)
    tree = ast.parse(path.read_text(), str(path))
    found, modules = [], {}
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom):
            source = _imported_from(node, module, path.name == "__init__.py")
            if not source.startswith("pullback") or _layer(source) == _layer(module):
                continue
            for alias in node.names:
                if _private(alias.name):
                    found.append(f"{path}:{node.lineno}: {alias.name} from {source}")
                else:
                    modules[alias.asname or alias.name] = f"{source}.{alias.name}"
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("pullback") and alias.asname:
                    modules[alias.asname] = alias.name
    for node in ast.walk(tree):
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in modules and _private(node.attr)
                and _layer(modules[node.value.id]) != _layer(module)):
            found.append(f"{path}:{node.lineno}: {node.attr} of {modules[node.value.id]}")
    return found


def test_layers_use_only_public_names_of_other_layers() -> None:
    found = [hit for path in sorted(PACKAGE.rglob("*.py"))
             for hit in _private_names_across_layers(path)]
    assert not found, "private names used across layers:\n" + "\n".join(found)
