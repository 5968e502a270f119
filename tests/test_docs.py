"""The documentation site and its guides: `mkdocs build --strict` passes (a broken
reference, link or included file fails it), every guide's script in examples/ runs
with small settings and prints what it promises, the scripts on the other pages run
(and print what the page shows), and every public name of the API has its entry in
the generated reference.

The site build and the scripts are separate processes started together (one module
fixture) so that they share the two cores instead of waiting for one another.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
TIMEOUT_S = 240


def _number(pattern: str, text: str) -> list[float]:
    return [float(x) for x in re.findall(pattern, text)]


def _custom_op(out: str) -> None:
    assert "gradcheck passed" in out
    # The wrong backward's error names the input, the worst element and both values.
    assert re.search(r"wrong backward caught: gradcheck: .*input 0 .*element .*analytical "
                     r"[-0-9.e]+, numerical [-0-9.e]+", out)
    (w,) = _number(r"fitted w = ([-0-9.]+)", out)
    assert abs(w - 1.5) < 1e-3


def _kernel_pair(out: str) -> None:
    (difference,) = _number(r"largest gradient difference ([-0-9.e+]+)", out)
    assert difference < 1e-12 and "gradcheck passed" in out


def _forward_only(out: str) -> None:
    first, last = _number(r"numpy-forward: step \d+ loss ([0-9.]+)", out)
    assert last < first - 0.05  # it trained ...
    (difference,) = _number(r"largest weight difference from CpuBackend: ([-0-9.e+]+)", out)
    assert difference < 1e-12  # ... exactly as CpuBackend's fused kernels do


def _onnx(out: str) -> None:
    assert "inference matches NumPy" in out and "exported and reloaded" in out
    first, last = _number(r"step \d+: loss ([0-9.]+)", out)
    assert last < 0.5 * first
    (accuracy,) = _number(r"train accuracy after fine-tuning: ([0-9.]+)", out)
    assert accuracy >= 0.7


def _transformer(out: str) -> None:
    losses = _number(r"step \d+: loss ([0-9.]+)", out)
    assert losses[-1] < 3.0 and losses[-1] < losses[0] - 0.3, losses
    assert re.search(r"^sample: the quick .{20}", out, flags=re.M)


def _data_parallel(out: str) -> None:
    losses = _number(r"epoch \d+: train loss ([0-9.]+)", out)
    assert len(losses) == 2 and losses[-1] < losses[0]
    (accuracy,) = _number(r"1 process\(es\), identical weights; train accuracy ([0-9.]+)", out)
    assert accuracy > 0.8


def _checkpoint(out: str) -> None:
    assert "resumed at step 10 (stopped halfway)" in out
    assert "resumed run equals the uninterrupted run: True" in out


def _pytorch_weights(out: str) -> None:
    assert "1.running_mean, 1.running_var, 1.num_batches_tracked" in out
    (difference,) = _number(r"largest output difference from PyTorch: ([-0-9.e+]+)", out)
    assert difference < 1e-5


# Each guide's script: the small settings the suite runs it with, and what its output
# must show.
SCRIPTS: dict[str, tuple[list[str], Callable[[str], None]]] = {
    "custom_op.py": (["--steps", "60"], _custom_op),
    "kernel_pair.py": ([], _kernel_pair),
    "forward_only_backend.py": (["--steps", "15"], _forward_only),
    "onnx_fine_tune.py": (["--steps", "40"], _onnx),
    "transformer.py": (["--steps", "25", "--width", "16", "--context", "8", "--batch", "8"],
                       _transformer),
    "data_parallel.py": (["--epochs", "2"], _data_parallel),
    "checkpoint_resume.py": (["--steps", "20"], _checkpoint),
    "pytorch_weights.py": ([], _pytorch_weights),
}


def _env() -> dict[str, str]:
    env = dict(os.environ, NO_MKDOCS_2_WARNING="1")
    # The scripts import this checkout's pullback, whatever is installed.
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    return env


@pytest.fixture(scope="module")
def runs(request: pytest.FixtureRequest,
         tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, subprocess.Popen]]:
    """The site build ("site", into a temporary folder) and the scripts, started at once:
    those of the tests selected in this session (all of them, unless `-k` says less)."""
    selected = {item.name for item in request.session.items if item.path == Path(__file__)}
    wanted = [s for s in SCRIPTS if f"test_guide_script_runs_and_prints_what_it_promises[{s}]"
              in selected]
    started = {}
    if "test_site_builds_strictly_with_every_api_name_in_the_reference" in selected:
        site = tmp_path_factory.mktemp("site")
        started["site"] = subprocess.Popen(
            [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
            cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        started["site"].site = site  # type: ignore[attr-defined]
    for script in wanted:
        args = SCRIPTS[script][0]
        started[script] = subprocess.Popen(
            [sys.executable, str(EXAMPLES / script), *args], cwd=tmp_path_factory.mktemp("run"),
            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    yield started
    for process in started.values():
        if process.poll() is None:
            process.kill()
            process.wait()


def _finish(process: subprocess.Popen, what: str) -> str:
    try:
        out, _ = process.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        process.kill()
        out, _ = process.communicate()
        pytest.fail(f"{what} did not finish in {TIMEOUT_S} s:\n{out}")
    assert process.returncode == 0, f"{what} failed:\n{out}"
    return out


# A page's Python block that starts with `import` is a whole script; a plain block
# right after it is what the script prints.
_BLOCK = re.compile(r"^```python\n(import .*?)^```\n(?:\n```\n(.*?)^```)?",
                    flags=re.S | re.M)
PAGES = [p for p in sorted((ROOT / "docs").rglob("*.md")) if _BLOCK.search(p.read_text())]


# `runs` first: the site build and the scripts run in their processes meanwhile.
@pytest.mark.usefixtures("runs")
@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT / "docs")))
def test_page_scripts_run_and_print_what_the_page_shows(page: Path, tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    for number, (source, shown) in enumerate(_BLOCK.findall(page.read_text()), 1):
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(compile(source, f"{page.name} python block {number}", "exec"), {})
        if shown:
            assert printed.getvalue() == shown


def test_every_script_in_examples_is_run_here_and_included_by_a_guide() -> None:
    scripts = sorted(p.name for p in EXAMPLES.glob("*.py"))
    assert scripts == sorted(SCRIPTS)
    guides = "".join(p.read_text() for p in (ROOT / "docs" / "guides").glob("*.md"))
    for script in scripts:
        assert f'--8<-- "examples/{script}"' in guides, script


@pytest.mark.parametrize("script", sorted(SCRIPTS))
def test_guide_script_runs_and_prints_what_it_promises(script: str, runs: dict) -> None:
    out = _finish(runs[script], f"examples/{script}")
    SCRIPTS[script][1](out)


# Every name of the public API (../shared/API.md), as the end of the identifier of its
# entry in the generated reference (`pb.tensor` is documented where `pullback.tensor`,
# the package, exports it; an op where its module declares it).
PB = """tensor from_numpy from_dlpack zeros ones full zeros_like ones_like arange randn rand
float32 float64 add sub mul div neg pow exp log sqrt abs relu sigmoid tanh silu softplus gelu
softmax log_softmax matmul sum mean max reshape transpose broadcast_to concatenate stack where
maximum minimum clip conv2d max_pool2d avg_pool2d layer_norm erf sign one_hot sin cos logsumexp
cumsum min var std norm prod any all argmax argmin topk sort argsort einsum split chunk unbind
tril triu masked_fill squeeze unsqueeze flatten permute take take_along_axis randint multinomial
scaled_dot_product_attention batch_norm grad value_and_grad vjp jvp linearize linear_transpose
no_grad checkpoint gradcheck GradcheckError Backend BackwardOps KernelError CpuBackend
ThreadedCpuBackend get_backend set_backend use_backend save load CustomOp LoweringMode compile
TracingError less less_equal greater greater_equal equal not_equal"""
TENSOR = """shape dtype ndim size numpy item grad requires_grad detach backward add_ mul_ zero_
copy_ fill_ __dlpack__ T __iadd__ __isub__ __imul__ __itruediv__ __iter__ __array__"""
MODULE = """forward __call__ parameters named_parameters state_dict load_state_dict train eval
traced_forward backprop update new_momentum new_rmsprop new_rmsprop_with_momentum modules
named_modules children apply zero_grad to double float"""
NN = """Module Dense Bias1d Conv2d GLU Residual LR Sequential ReLU Sigmoid Tanh GELU Flatten
MaxPool2d Dropout LayerNorm cross_entropy mse_loss binary_cross_entropy_with_logits nll_loss
l1_loss smooth_l1_loss huber_loss Linear Embedding BatchNorm1d BatchNorm2d MultiheadAttention
TransformerEncoderLayer LSTM GRU Identity SiLU Softmax AvgPool2d AdaptiveAvgPool2d ModuleDict
Conv1d"""
INIT = """normal_ uniform_ zeros_ ones_ xavier_uniform_ xavier_normal_ kaiming_uniform_
kaiming_normal_ trunc_normal_"""
OPTIM = "TrainParams SGD RMSProp Adam AdamW clip_grad_norm"
OPTIMIZER = "step zero_grad param_groups"
DIST = """init rank size local_rank broadcast_parameters broadcast_optimizer_state
DistributedOptimizer allreduce shard"""
API = (
    [f".{n}" for n in PB.split()]
    + [f".Tensor.{n}" for n in TENSOR.split()]
    + [f"nn.Module.{n}" for n in MODULE.split()]
    + [f"nn.{n}" for n in NN.split()]
    + [f"nn.init.{n}" for n in INIT.split()]
    + [f"optim.{n}" for n in OPTIM.split()]
    + [f"optim.GradApplyer.{n}" for n in OPTIMIZER.split()]
    + [f"distributed.{n}" for n in DIST.split()]
    + ["kernels.kernel", "onnx.load", "onnx.export", "lower.Plan.explain"]
)


def test_site_builds_strictly_with_every_api_name_in_the_reference(runs: dict) -> None:
    _finish(runs["site"], "mkdocs build --strict")
    reference = runs["site"].site / "reference"
    ids = set()
    for page in reference.rglob("index.html"):
        ids.update(re.findall(r'id="(pullback\.[^"]+)"', page.read_text()))
    # A name that is also a submodule's (`pullback.distributed.shard`) is documented
    # where that module defines it (`pullback.distributed.shard.shard`); Tensor.backward
    # is `pullback.tensor.backward.backward`, installed on Tensor by that module.
    missing = [name for name in API if not any(
        i.endswith((name, name + "." + name.rsplit(".", 1)[-1])) for i in ids)
        and not (name == ".Tensor.backward" and "pullback.tensor.backward.backward" in ids)]
    assert not missing, f"not in the reference: {missing}"
    # The how-to pages carry their scripts (snippets), and the concepts their diagrams.
    custom_op = (runs["site"].site / "guides" / "custom-op" / "index.html").read_text()
    assert "SoftClip" in custom_op
    plans = (runs["site"].site / "concepts" / "plans" / "index.html").read_text()
    assert 'class="mermaid"' in plans and "saved activations:" in plans
