"""The tensor methods that primitives declare (`tensor_method`) are spelled out for type
checkers in `_Operators`' TYPE_CHECKING block; the two lists must agree."""

import ast
import inspect

from pullback.ops import PRIMITIVES
from pullback.tensor import eager


def _declared_for_type_checkers() -> set[str]:
    tree = ast.parse(inspect.getsource(eager))
    (operators,) = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "_Operators"]
    (block,) = [n for n in operators.body if isinstance(n, ast.If)
                and ast.unparse(n.test) == "TYPE_CHECKING"]
    return {target.id for stmt in block.body if isinstance(stmt, ast.Assign)
            for target in stmt.targets if isinstance(target, ast.Name)}


def test_type_checkers_see_every_primitive_method():
    methods = {p.method.__name__ for p in PRIMITIVES.values() if p.method is not None}
    assert methods, "no primitive declares a tensor method"
    assert _declared_for_type_checkers() == methods
