"""The default job behind `pullback train`: a small CNN (or an MLP, or a small ResNet
with BatchNorm) on the bundled digits.

Training is resumable exactly: every epoch ends with an atomic training
checkpoint (model, optimizer state, step, and the one random generator that
drives initialization, shuffling and dropout), so a run interrupted and
resumed ends with the same weights, bit for bit, as one that never stopped.

Before any training, the output folder is checked (creatable, writable, and not
holding another run's checkpoint unless resuming or overwriting), so a file-system
problem is one clear error at the start, not a traceback after an epoch.

Under `mpirun -n N` the job trains data-parallel with the same global batches as one
process: every process draws the same shuffled order from the same generator, takes
its part of each batch, and the gradients are averaged (pullback.distributed), so the
weights match one process's to float32 rounding. Rank 0 alone reads and writes the
output folder and prints; the checkpoint does not depend on N, so a run resumes on
any number of processes. See docs/distributed.md.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import numpy as np
from numpy.typing import NDArray

from . import nn, optim
from .backend import CpuBackend, ThreadedCpuBackend
from .backend.current import use_backend
from .distributed.job import Processes, fail_if_asked, quiet
from .distributed.optimizer import DistributedOptimizer
from .io import batches, digits_split, load_training, save, save_training, training_metadata
from .io.atomic import check_writable
from .lower import LoweringMode, Plan, compile
from .tensor import Tensor, creation, no_grad, tensor

if TYPE_CHECKING:
    from .gpt import GPTConfig

MODELS = ("cnn", "mlp", "resnet")
OPTIMIZERS = ("adam", "adamw", "sgd", "momentum", "rmsprop")
BACKENDS = {"cpu": CpuBackend, "threaded": ThreadedCpuBackend}
CHECKPOINT = "checkpoint.safetensors"

# An epoch's record in a run's history: "epoch" and losses (and accuracies) by name.
Epoch = dict[str, float]
# A training step: (inputs, targets, weight) -> (loss, logits), gradients left in .grad.
StepFunction = Callable[[NDArray[Any], NDArray[Any], NDArray[np.float32]],
                        tuple[Tensor, Tensor]]
_Item = TypeVar("_Item")


@dataclass
class TrainConfig:
    """Everything a run depends on; stored in its checkpoint."""

    model: str = "cnn"
    epochs: int = 30
    batch_size: int = 32
    lr: float = 2e-3
    optimizer: str = "adam"
    seed: int = 0
    backend: str = "cpu"
    output: str = "pullback-run"
    eager: bool = False  # True: eager autograd; False: a compiled TRAINING plan

    def check(self) -> None:
        if self.model not in MODELS:
            raise ValueError(f"train: model must be one of {MODELS}, not {self.model!r}")
        check_choices(self.optimizer, self.backend)
        if self.epochs < 1 or self.batch_size < 1 or not self.lr > 0:
            raise ValueError("train: epochs and batch size must be >= 1 and lr > 0, got "
                             f"{self.epochs}, {self.batch_size} and {self.lr}")


def check_choices(optimizer: str, backend: str) -> None:
    """The optimizer and backend settings every job shares, checked by name."""
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"train: optimizer must be one of {OPTIMIZERS}, not {optimizer!r}")
    if backend not in BACKENDS:
        raise ValueError(f"train: backend must be one of {tuple(BACKENDS)}, not {backend!r}")


@dataclass
class TrainResult:
    test_accuracy: float
    history: list[Epoch] = field(default_factory=list)
    model: nn.Module | None = None


class ResidualBlock(nn.Module):
    """ResNet's basic block with an identity shortcut: relu(bn(conv(relu(bn(conv(x))))) + x),
    3x3 convolutions that keep the width and the 8x8 digits' size."""

    def __init__(self, width: int):
        super().__init__()
        self.conv1 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU()

    def forward(self, x: Tensor) -> Tensor:
        y = self.relu(self.bn1(self.conv1(x)))
        return self.relu(self.bn2(self.conv2(y)) + x)


def resnet(width: int = 16, blocks: int = 2) -> nn.Module:
    """A small ResNet for 1x8x8 images: a conv-BN-ReLU stem, `blocks` residual blocks,
    global average pooling and a linear head over 10 classes."""
    return nn.Sequential(
        nn.Conv2d(1, width, 3, padding=1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        *[ResidualBlock(width) for _ in range(blocks)],
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dense(width, 10),
    )


def build_model(name: str) -> nn.Module:
    if name == "resnet":
        return resnet()
    if name == "cnn":
        return nn.Sequential(
            nn.Conv2d(1, 32, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(32, 64, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Dense(64 * 2 * 2, 10),
        )
    return nn.Sequential(nn.Flatten(), nn.Dense(64, 256), nn.ReLU(), nn.Dense(256, 256),
                         nn.ReLU(), nn.Dense(256, 10))


def make_optimizer(name: str, params: list[Tensor], peak_lr: float, total_steps: int
                   ) -> optim.GradApplyer:
    """The named optimizer, its learning rate decayed along a cosine over the whole run."""
    lr = optim.TrainParams(peak_lr, schedule=optim.cosine(total_steps))
    if name == "adam":
        return optim.Adam(params, lr)
    if name == "adamw":
        return optim.AdamW(params, lr)
    if name == "sgd":
        return optim.SGD(params, lr)
    if name == "momentum":
        return optim.SGD(params, lr, momentum=0.9)
    return optim.RMSProp(params, lr)


def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray) -> tuple[float, float]:
    """(mean loss, accuracy) in eval mode, without recording."""
    model.eval()
    with no_grad():
        logits = model(tensor(x))
        loss = nn.cross_entropy(logits, y).item()
    model.train()
    return loss, float((logits.numpy().argmax(axis=1) == y).mean())


def train(config: TrainConfig, *, resume: bool = False, overwrite: bool = False,
          progress: bool = True, log: Callable[[str], None] = print,
          stop_after: int | None = None) -> TrainResult:
    """Train, evaluate each epoch on the held-out split, checkpoint each epoch.

    `resume` continues from the checkpoint in `config.output`; without it an
    existing checkpoint there is an error unless `overwrite`. `stop_after` ends
    the run after that many epochs, as an interruption would. Raises ValueError
    (one line) for bad settings or an unusable output folder, before training.
    Under mpirun, every process calls it, trains its part of each batch, and
    returns rank 0's result; only rank 0 logs and writes.
    """
    config.check()
    procs = Processes.start()
    x_train, y_train, x_test, y_test = digits_split()
    procs.check_batches(len(x_train), config.batch_size)
    say = log if procs.primary else quiet
    out = procs.agree(lambda: prepare_output(config.output, resume=resume,
                                             overwrite=overwrite))
    with use_backend(BACKENDS[config.backend]()):
        creation.manual_seed(config.seed)
        model = build_model(config.model)
        steps_per_epoch = -(-len(x_train) // config.batch_size)
        optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr,
                                   config.epochs * steps_per_epoch)
        history: list[Epoch] = []
        step = 0
        if resume:
            step, history = procs.agree(
                lambda: resume_run(out / CHECKPOINT, config, model, optimizer))
            say(f"resumed from {out / CHECKPOINT} after epoch {len(history)}")
        averaged = procs.share(model, optimizer)
        # One generator drives initialization, shuffling and dropout: resuming restores it,
        # and every process draws the same shuffled order from it.
        rng = creation.default_generator()
        step_fn = _step_function(model, config.eager)
        watchdog = procs.watchdog()
        started, trained_steps = time.perf_counter(), 0
        with procs.abort_on_error(), watchdog:
            for epoch in range(len(history), config.epochs):
                if stop_after is not None and epoch >= stop_after:
                    break
                order = batches(x_train, y_train, config.batch_size, rng=rng)
                bar = progress_bar(order, steps_per_epoch, epoch, config,
                                   progress and procs.primary)
                sums = _train_epoch(procs, bar, step_fn, averaged, step, watchdog.beat)
                step += int(sums[3])
                trained_steps += int(sums[3])
                loss_sum, correct, seen = procs.sum(sums[:3])
                train_loss, train_acc = float(loss_sum / seen), float(correct / seen)
                if procs.primary:
                    test_loss, test_acc = evaluate(model, x_test, y_test)
                    history.append({"epoch": epoch + 1, "train_loss": train_loss,
                                    "train_accuracy": train_acc, "test_loss": test_loss,
                                    "test_accuracy": test_acc})
                    if progress:
                        log(f"epoch {epoch + 1}/{config.epochs}: train loss {train_loss:.4f} "
                            f"accuracy {train_acc:.4f}, test loss {test_loss:.4f} "
                            f"accuracy {test_acc:.4f}")
                    save_training(out / CHECKPOINT, model=model, optimizer=optimizer, step=step,
                                  rng=rng, extra={"history": history, "config": asdict(config)})
            elapsed = time.perf_counter() - started
            procs.check_same_parameters(model)
            accuracy: float | None = None
            if procs.primary:
                save(model.state_dict(), out / "model.safetensors")
                plot_history(history, out / "history.png", log)
                _, accuracy = evaluate(model, x_test, y_test)
            accuracy, history = procs.from_primary((accuracy, history))
            assert accuracy is not None  # rank 0's, which every process now holds
    rate = trained_steps / elapsed if elapsed > 0 else 0.0
    on = f" on {procs.size} processes" if procs.size > 1 else ""
    say(f"{trained_steps} steps in {elapsed:.1f} s ({rate:.0f} steps/s){on}; "
        f"checkpoint and weights in {out}/")
    return TrainResult(accuracy, history, model)


def _train_epoch(procs: Processes, bar: Iterable[tuple[NDArray[Any], NDArray[Any]]],
                 step_fn: StepFunction, optimizer: optim.GradApplyer | DistributedOptimizer,
                 step: int, beat: Callable[[], None]) -> NDArray[np.float64]:
    """One epoch of steps on this process's part of each global batch, calling `beat`
    after each; returns this process's [loss x samples, correct, samples, steps]."""
    sums = np.zeros(4)
    for xb, yb in bar:
        fail_if_asked(procs.rank, step + int(sums[3]) + 1)
        part = procs.part(len(yb))
        x, y = xb[part], yb[part]
        # The averaged gradient is the global batch's mean: weight each process's mean
        # loss by its share of the batch (1 with one process, or equal parts).
        weight = np.array(len(y) * procs.size / len(yb), dtype=np.float32)
        optimizer.zero_grad()
        loss, logits = step_fn(x, y, weight)
        optimizer.step()
        beat()
        sums += (loss.item() * len(y), int((logits.numpy().argmax(axis=1) == y).sum()),
                 len(y), 1)
        if hasattr(bar, "set_postfix"):
            # rank 0's share of the epoch so far, shown at the bar's next redraw
            bar.set_postfix(loss=f"{sums[0] / sums[2]:.4f}", acc=f"{sums[1] / sums[2]:.4f}",
                            refresh=False)
    return sums


def _first_existing(path: Path) -> Path:
    while not path.exists() and path != path.parent:
        path = path.parent
    return path


def prepare_output(output: str, *, resume: bool, overwrite: bool) -> Path:
    """The output folder, created if need be and checked writable; ValueError (one
    line) if it cannot be used, or if it holds a checkpoint a new run would replace."""
    if resume and overwrite:
        raise ValueError("train: --resume continues the run in the output folder and "
                         "--overwrite starts it again; give one of them")
    if not output:
        raise ValueError("train: --output is empty; name the folder for the checkpoint "
                         "and weights")
    out = Path(output)
    checkpoint = out / CHECKPOINT
    if out.exists() and not out.is_dir():
        raise ValueError(f"train: --output {out} is a file, not a folder")
    if resume and not checkpoint.is_file():
        raise ValueError(f"train --resume: no checkpoint at {checkpoint}; run without "
                         "--resume first (or pick that run's --output)")
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        # A path under a regular file, a read-only parent, a name too long: say which.
        blocker = _first_existing(out.parent)
        reason = f"{blocker} is a file" if blocker.exists() and not blocker.is_dir() \
            else (error.strerror or str(error))
        raise ValueError(f"train: cannot create the output folder {out}: {reason}") from None
    try:
        check_writable(out)
    except OSError as error:
        raise ValueError(f"train: cannot write to the output folder {out}: "
                         f"{error.strerror or error}") from None
    if not resume and not overwrite and os.path.lexists(checkpoint):
        raise ValueError(f"train: {checkpoint} already exists (another run's checkpoint); "
                         "continue that run with --resume, or replace it with --overwrite")
    return out


def _step_function(model: nn.Module, eager: bool) -> StepFunction:
    """`(x, y, weight) -> (loss, logits)` leaving the gradients of `weight * loss` in
    `.grad` (`weight` a float32 scalar array): eager autograd, or a TRAINING plan (traced
    again for another batch shape: the last batch of an epoch may be smaller)."""
    if eager:
        def eager_step(x: NDArray[Any], y: NDArray[Any], weight: NDArray[np.float32]
                       ) -> tuple[Tensor, Tensor]:
            logits = model(tensor(x))
            loss = nn.cross_entropy(logits, y)
            (loss * tensor(weight)).backward()
            return loss, logits

        return eager_step
    plans: dict[tuple[int, ...], Plan] = {}

    def weighted_loss(x: Tensor, y: Tensor, weight: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        logits = model(x)
        loss = nn.cross_entropy(logits, y)
        return loss * weight, loss, logits

    def planned_step(x: NDArray[Any], y: NDArray[Any], weight: NDArray[np.float32]
                     ) -> tuple[Tensor, Tensor]:
        plan = plans.get(x.shape)
        if plan is None:
            plan = plans[x.shape] = compile(weighted_loss, x, y, weight,
                                            mode=LoweringMode.TRAINING)
        _, loss, logits = plan(x, y, weight)
        return loss, logits

    return planned_step


def resume_run(path: Path, config: TrainConfig | GPTConfig, model: nn.Module,
               optimizer: optim.GradApplyer) -> tuple[int, list[Epoch]]:
    # The settings are compared before loading: another optimizer or model would
    # otherwise fail on a missing state key, which hides the real difference.
    metadata = training_metadata(path)
    # save_training makes the generator optional; a run resumes exactly only with it.
    no_rng = (f"train --resume: {path} holds no random generator state (it was not saved "
              "by `pullback train`); start again with --overwrite")
    if metadata["rng"] is None:
        raise ValueError(no_rng)
    saved = metadata["extra"].get("config", {})
    if not isinstance(saved, dict):
        saved = {}
    now = asdict(config)
    differs = [f"--{k.replace('_', '-')} {v!r} (now {now[k]!r})"
               for k, v in saved.items() if k in now and k not in ("output", "backend")
               and now[k] != v]
    if differs:
        raise ValueError(f"train --resume: {path} was made with other settings: "
                         f"{', '.join(differs)}; resume with those, or start again with "
                         "--overwrite")
    state = load_training(path, model=model, optimizer=optimizer)
    rng = state["rng"]
    if rng is None:  # the file changed since it was read above
        raise ValueError(no_rng)
    creation.set_default_generator(rng)
    return state["step"], list(state["extra"].get("history", []))


def progress_bar(iterable: Iterable[_Item], total: int, epoch: int,
                 config: TrainConfig | GPTConfig, enabled: bool) -> Iterable[_Item]:
    if not enabled:
        return iterable
    from tqdm import tqdm

    return tqdm(iterable, total=total, desc=f"epoch {epoch + 1}/{config.epochs}",
                leave=False, dynamic_ncols=True, mininterval=0.25)


def plot_history(history: list[Epoch], path: Path, log: Callable[[str], None],
                 held_out: str = "test") -> None:
    """Loss (and accuracy, where the history has it) per epoch as a PNG, when
    matplotlib is installed; `held_out` names the split behind the "test_" keys."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return
    epochs = [h["epoch"] for h in history]
    metrics = [m for m in ("loss", "accuracy") if history and f"train_{m}" in history[0]]
    if not metrics:
        return
    figure, panels = plt.subplots(1, len(metrics), figsize=(4.5 * len(metrics), 3.5),
                                  squeeze=False)
    for metric, axes in zip(metrics, panels[0]):
        for key, label in ((f"train_{metric}", "train"), (f"test_{metric}", held_out)):
            axes.plot(epochs, [h[key] for h in history], marker="o", label=label)
        axes.set(xlabel="epoch", ylabel="cross-entropy" if metric == "loss" else metric,
                 title=metric)
        axes.legend()
        axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=100)
    plt.close(figure)
    log(f"wrote {path}")
