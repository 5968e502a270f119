"""The package as a user gets it: `python -m build` makes a wheel and an sdist, and the
wheel installed into a fresh venv imports, says its version and trains.

The venv sees the test environment's dependencies (NumPy, Numba, ...) through a .pth
file, so nothing downloads; pullback itself comes only from the wheel (a .pth line
adds a folder to sys.path but runs no .pth inside it, so the editable install of the
checkout stays out).
"""

from __future__ import annotations

import os
import re
import site
import subprocess
import sys
import sysconfig
import tarfile
import zipfile
from pathlib import Path

import pullback

ROOT = Path(__file__).resolve().parents[1]


def _run(command: list, **options) -> str:
    done = subprocess.run([str(c) for c in command], capture_output=True, text=True,
                          timeout=300, **options)
    assert done.returncode == 0, f"{command} failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


def test_wheel_installs_into_a_fresh_venv_and_trains(tmp_path):
    dist = tmp_path / "dist"
    # No isolation: the build uses this environment's setuptools instead of downloading one.
    _run([sys.executable, "-m", "build", "--no-isolation", "--outdir", dist, ROOT])
    wheels = list(dist.glob("pullback-*.whl"))
    sdists = list(dist.glob("pullback-*.tar.gz"))
    assert len(wheels) == 1 and len(sdists) == 1, sorted(p.name for p in dist.iterdir())
    version = pullback.__version__
    assert wheels[0].name.startswith(f"pullback-{version}-py3-none-any")

    with zipfile.ZipFile(wheels[0]) as wheel:
        names = set(wheel.namelist())
    assert "pullback/data/digits.csv.gz" in names
    assert "pullback/kernels/conv.py" in names
    assert "pullback/py.typed" in names  # type checkers read the installed package's types
    assert not any(name.startswith("tests/") for name in names)
    entry = next(n for n in names if n.endswith(".dist-info/entry_points.txt"))
    with zipfile.ZipFile(wheels[0]) as wheel:
        assert "pullback = pullback.cli:main" in wheel.read(entry).decode()
    with tarfile.open(sdists[0]) as sdist:
        members = {Path(*Path(m).parts[1:]).as_posix() for m in sdist.getnames()}
    assert {"pyproject.toml", "README.md", "pullback/__init__.py"} <= members

    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", venv])
    bin_dir = venv / ("Scripts" if os.name == "nt" else "bin")
    python = bin_dir / "python"
    venv_site = Path(_run([python, "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"])
                     .strip())
    ours = {sysconfig.get_path("purelib"), sysconfig.get_path("platlib"), *site.getsitepackages()}
    (venv_site / "dependencies.pth").write_text("\n".join(sorted(ours)) + "\n")
    _run([sys.executable, "-m", "pip", "--python", python, "install", "--no-deps", "--no-index",
          "--quiet", wheels[0]])

    # Run from tmp_path: `python -c` puts the working directory (here the checkout) first.
    where = _run([python, "-c", "import pullback; print(pullback.__file__)"], cwd=tmp_path)
    where = where.strip()
    assert Path(where).is_relative_to(venv), where
    assert _run([bin_dir / "pullback", "--version"], cwd=tmp_path).strip() == f"pullback {version}"
    out = _run([bin_dir / "pullback", "train", "--epochs", "1", "--no-progress", "--output",
                tmp_path / "run"], cwd=tmp_path)
    last = out.strip().splitlines()[-1]
    accuracy = re.fullmatch(r"test accuracy: (\d\.\d+)", last)
    assert accuracy, out[-2000:]
    # One epoch of the default CNN: far above chance (0.1), short of the 30-epoch 0.97.
    assert float(accuracy.group(1)) > 0.5
    assert (tmp_path / "run" / "model.safetensors").exists()
