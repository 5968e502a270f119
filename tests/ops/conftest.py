"""The op tests share their table (`op_table.py`) and checkers (`op_check.py`) as plain
modules beside the tests; make them importable under any pytest import mode."""

from __future__ import annotations

import sys
from pathlib import Path

_HERE = str(Path(__file__).parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
