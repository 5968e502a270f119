"""The README's Python examples run as written, in order, in one namespace (each later
block may use what an earlier one defined), so that what a new user copies works."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_python_blocks_run(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", README.read_text(), flags=re.S | re.M)
    assert len(blocks) >= 5
    monkeypatch.chdir(tmp_path)  # the examples write model files into the working folder
    namespace: dict = {"__name__": "readme"}
    for number, source in enumerate(blocks, 1):
        exec(compile(source, f"README.md python block {number}", "exec"), namespace)
    # The examples' own claims, checked: the transformer's logits and the ResNet's mode.
    assert namespace["logits"].shape == (32, 10)  # the ONNX block's, run last
    assert namespace["resnet"].training is False
    assert namespace["gpt"].tokens.weight.grad is not None
