"""Types an editor can use: mypy passes over the whole package as pyproject.toml
configures it (strict for the public layers) and over the guides' scripts, and the
public API says what it takes and gives: no public function or method of `pb`, `pb.nn`,
`pb.optim`, `pb.io` or `pb.onnx` has a parameter or result annotated `Any` or left
unannotated.

`Any` remains legitimate for values that really are anything (`*args`/`**kwargs` passed
through); those are not counted, nor the one result in `ANY_ON_PURPOSE`.
"""

from __future__ import annotations

import inspect
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pullback as pb
from pullback import io, nn, onnx, optim

ROOT = Path(__file__).resolve().parent.parent

# The base `Module.forward` only raises (a subclass defines forward); its result is what
# a module known only as `nn.Module` gives when called, and that may be anything, as in
# PyTorch. Each layer's forward, and so its call, has its own result type.
ANY_ON_PURPOSE = {"pullback.nn.Module.forward": ["return"]}


def test_mypy_passes_as_configured():
    """The package; tests/type_usage.py, what users' code sees when it calls it; and the
    guides' scripts in examples/, as a user's code."""
    done = subprocess.run([sys.executable, "-m", "mypy", "pullback", "tests/type_usage.py",
                           "examples"],
                          cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-2000:]
    assert "Success: no issues found" in done.stdout


def _public_functions(module: ModuleType) -> Iterator[tuple[str, Callable]]:
    for name in module.__all__:
        obj = getattr(module, name)
        if inspect.isfunction(obj):
            yield f"{module.__name__}.{name}", obj
        elif inspect.isclass(obj) and obj.__module__.startswith("pullback"):
            for attr, value in vars(obj).items():
                if isinstance(value, (staticmethod, classmethod)):
                    value = value.__func__
                if isinstance(value, property):
                    value = value.fget
                public = not attr.startswith("_") or attr in ("__init__", "__call__")
                if public and inspect.isfunction(value):
                    yield f"{module.__name__}.{name}.{attr}", value


def _untyped(fn: Callable) -> list[str]:
    """The parameters (and "return") of `fn` annotated `Any` or not at all."""
    signature = inspect.signature(fn)
    missing = []
    for i, (name, parameter) in enumerate(signature.parameters.items()):
        if i == 0 and name in ("self", "cls"):
            continue
        if parameter.kind in (parameter.VAR_POSITIONAL, parameter.VAR_KEYWORD):
            continue
        if parameter.annotation in (inspect.Parameter.empty, "Any"):
            missing.append(name)
    if signature.return_annotation in (inspect.Signature.empty, "Any"):
        missing.append("return")
    return missing


def test_public_api_has_real_types():
    seen, untyped = 0, {}
    for module in (pb, nn, optim, io, onnx):
        for name, fn in _public_functions(module):
            seen += 1
            if (missing := _untyped(fn)) and missing != ANY_ON_PURPOSE.get(name):
                untyped[name] = missing
    assert seen > 300  # the walk found the API, not an empty list
    assert not untyped, f"{len(untyped)} public functions say Any: {untyped}"


def test_the_check_catches_any():
    def tanh(x: Any) -> Any:
        return x

    def typed(x: pb.TensorLike, *args: Any) -> pb.Tensor:
        return pb.tensor(x)

    def bare(x, y: int = 0):  # type: ignore[no-untyped-def]
        return x

    assert _untyped(tanh) == ["x", "return"]
    assert _untyped(typed) == []
    assert _untyped(bare) == ["x", "return"]
