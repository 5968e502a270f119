"""The ops `pb` offers are visible to type checkers: `pullback.ops` spells its `__all__`
out as a literal for them (mypy reads no other form), and that list must stay the one
the declaration modules' lists add up to at run time."""

from __future__ import annotations

import ast
from pathlib import Path

import pullback as pb
from pullback import ops


def _static_all() -> list[str]:
    tree = ast.parse(Path(ops.__file__).read_text())
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Name) \
                and node.test.id == "TYPE_CHECKING":
            for statement in node.body:
                if isinstance(statement, ast.Assign) and any(
                        isinstance(t, ast.Name) and t.id == "__all__" for t in statement.targets):
                    return list(ast.literal_eval(statement.value))
    raise AssertionError("pullback/ops/__init__.py has no literal __all__ for type checkers")


def test_the_literal_all_names_the_ops_the_modules_declare():
    static = _static_all()
    assert len(set(static)) == len(static)
    missing = sorted(set(ops.__all__) - set(static))
    extra = sorted(set(static) - set(ops.__all__))
    assert not missing and not extra, (
        f"pullback/ops/__init__.py's literal __all__ (for type checkers) lacks {missing} and "
        f"has {extra} beyond the declaration modules' lists: update it")


def test_pb_offers_each_op():
    assert all(hasattr(pb, name) for name in _static_all())
