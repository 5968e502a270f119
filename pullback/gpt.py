"""The GPT job behind `pullback train --model gpt` and `pullback sample`.

A character-level transformer (token and position embeddings, pre-norm encoder
layers under a causal mask, a LayerNorm and a linear head) trained on text that
every machine with Python has: the standard library's own `.py` sources, split
into train and validation by file, or on `--text FILE` (its last tenth is the
validation text). Characters are bytes: the vocabulary is the sorted bytes seen,
stored in the checkpoint so `pullback sample` decodes what the run encoded.

Output folder, resuming, the optimizer and its schedule, checkpoints and the
progress bar are the digits job's (pullback/training.py); this module adds the
text, the model, the fixed-shape batches and the sampler.
"""

from __future__ import annotations

import os
import sysconfig
import time
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from numpy.typing import NDArray

from . import nn
from .backend.current import use_backend
from .distributed.job import Processes, fail_if_asked, quiet
from .io import save, save_training, training_metadata
from .io.checkpoint import read_arrays
from .lower import LoweringMode, compile
from .nn.kv_cache import KVCache, dense_step, encoder_layer_step
from .tensor import Tensor, creation, no_grad, tensor
from .training import (
    BACKENDS,
    CHECKPOINT,
    Epoch,
    check_choices,
    make_optimizer,
    plot_history,
    prepare_output,
    progress_bar,
    resume_run,
)

MODEL = "gpt"
VALIDATION_EVERY = 10  # every tenth file of the standard library (in a fixed order)
STDLIB_CHARS = 3_000_000  # at most this much text is read (reading all costs seconds)
_LEFT_OUT = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


@dataclass
class GPTConfig:
    """Everything a GPT run depends on; stored in its checkpoint."""

    model: str = MODEL
    epochs: int = 8
    steps_per_epoch: int = 100
    batch_size: int = 32
    lr: float = 3e-3
    optimizer: str = "adamw"
    seed: int = 0
    backend: str = "cpu"
    output: str = "pullback-run"
    eager: bool = False
    text: str = ""  # a text file; empty: the standard library's sources
    context: int = 64
    width: int = 128
    heads: int = 4
    layers: int = 2
    eval_batches: int = 8  # validation windows: eval_batches * batch_size of them

    def check(self) -> None:
        check_choices(self.optimizer, self.backend)
        sizes = {"epochs": self.epochs, "steps per epoch": self.steps_per_epoch,
                 "batch size": self.batch_size, "context": self.context,
                 "width": self.width, "heads": self.heads, "layers": self.layers,
                 "eval batches": self.eval_batches}
        small = [f"{k} {v}" for k, v in sizes.items() if v < 1]
        if small or not self.lr > 0:
            raise ValueError(f"train: sizes must be >= 1 and lr > 0, got "
                             f"{', '.join(small) or f'lr {self.lr}'}")
        if self.width % self.heads:
            raise ValueError(f"train: --width {self.width} must be a multiple of --heads "
                             f"{self.heads}")


@dataclass
class GPTResult:
    validation_loss: float
    sample: str
    history: list[Epoch] = field(default_factory=list)
    model: GPT | None = None


class GPT(nn.Module):
    """A character-level transformer: token and position embeddings, pre-norm
    encoder layers under a causal mask, a final LayerNorm and a linear head."""

    def __init__(self, vocab: int, context: int, width: int, heads: int, layers: int):
        super().__init__()
        self.context = context
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(
            nn.TransformerEncoderLayer(width, heads, 4 * width, dropout=0.0,
                                       activation="gelu", norm_first=True)
            for _ in range(layers))
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: Tensor) -> Tensor:
        """(batch, time) integer ids -> (batch, time, vocab) logits."""
        x = self.tokens(ids) + self.positions(creation.arange(ids.shape[1]))
        for block in self.blocks:
            x = block(x, is_causal=True)
        return self.head(self.norm(x))

    def new_cache(self, batch: int = 1) -> KVCache:
        """An empty cache of keys and values for `step`: `context` positions per layer."""
        # ModuleList gives its items as Modules; these are the encoder layers built above.
        attn = self.blocks[0].self_attn
        return KVCache(len(self.blocks), batch, attn.num_heads, self.context, attn.head_dim,
                       self.head.weight.dtype)

    def step(self, ids: Tensor | NDArray[np.integer[Any]], cache: KVCache) -> Tensor:
        """(batch, T) ids at positions cache.length.. -> their (batch, T, vocab) logits,
        as `forward` gives them for those rows of the whole sequence (in eval mode),
        computing only the new rows; their keys and values join `cache`. Inference
        only: the logits carry no gradient."""
        start, t = cache.length, len(ids[0])
        if start + t > self.context:
            raise ValueError(f"GPT.step: {start} cached and {t} new positions exceed the "
                             f"context of {self.context}; clear the cache and start again "
                             f"from the last ids")
        with no_grad():
            x = self.tokens(ids) + self.positions(creation.arange(start, start + t))
            for index, block in enumerate(self.blocks):
                x = encoder_layer_step(block, x, cache,
                                       index)
            cache.length = start + t
            return dense_step(self.head, self.norm(x), cache)


def stdlib_texts() -> tuple[bytes, bytes]:
    """(train, validation) text from the standard library's `.py` files: sorted by
    path, then taken in one fixed shuffled order, every `VALIDATION_EVERY`-th file to
    validation and the others to training, until `STDLIB_CHARS` have been read.
    Tests and site-packages are left out (test data holds deliberately odd files)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = []
    for folder, subfolders, names in os.walk(root):
        # Pruned while walking: site-packages alone can hold far more files than the library.
        subfolders[:] = [d for d in subfolders if d not in _LEFT_OUT]
        files += [Path(folder, n) for n in names if n.endswith(".py")]
    files.sort()
    if len(files) < VALIDATION_EVERY:
        raise ValueError(f"train: found only {len(files)} .py files under {root}; "
                         "give a text file with --text")
    train: list[bytes] = []
    validation: list[bytes] = []
    size = 0
    # Spread over the whole library, not its alphabetical start, in a fixed order.
    for position, index in enumerate(np.random.default_rng(0).permutation(len(files))):
        try:
            data = files[index].read_bytes()
        except OSError:
            continue
        (validation if position % VALIDATION_EVERY == 0 else train).append(data)
        size += len(data)
        if size >= STDLIB_CHARS:
            break
    return b"\n".join(train), b"\n".join(validation)


def file_texts(path: str) -> tuple[bytes, bytes]:
    """(train, validation) text from one file: its first nine tenths and its last."""
    try:
        data = Path(path).read_bytes()
    except OSError as error:
        raise ValueError(f"train: cannot read --text {path}: {error.strerror or error}") \
            from None
    cut = len(data) * 9 // 10
    return data[:cut], data[cut:]


def load_texts(config: GPTConfig) -> tuple[bytes, bytes]:
    train, validation = file_texts(config.text) if config.text else stdlib_texts()
    shortest = config.context + 1
    if len(train) < shortest or len(validation) < shortest:
        source = config.text or "the standard library"
        raise ValueError(f"train: the text from {source} is too short for --context "
                         f"{config.context}: {len(train)} training and {len(validation)} "
                         f"validation bytes, each needs at least {shortest}")
    return train, validation


def encode(data: bytes, vocab: list[int]) -> np.ndarray:
    """Bytes -> ids (positions in `vocab`); ValueError naming a byte not in it."""
    lookup = np.full(256, -1, np.int64)
    lookup[vocab] = np.arange(len(vocab))
    ids = lookup[np.frombuffer(data, np.uint8)]
    if (ids < 0).any():
        missing = sorted({bytes([b]) for b in np.frombuffer(data, np.uint8)[ids < 0]})
        raise ValueError(f"characters not in the run's vocabulary: {missing[:10]}")
    return ids


def decode(ids: Iterable[int], vocab: list[int]) -> str:
    return bytes(vocab[int(i)] for i in ids).decode("utf-8", errors="replace")


def _windows(ids: np.ndarray, starts: np.ndarray, context: int) -> np.ndarray:
    """(len(starts), context + 1) ids: inputs are [:, :-1], targets [:, 1:]."""
    return ids[starts[:, None] + np.arange(context + 1)]


def _validation_starts(ids: np.ndarray, config: GPTConfig) -> np.ndarray:
    # Evenly spaced, so every evaluation (and every resumed run) sees the same windows.
    count = config.eval_batches * config.batch_size
    last = len(ids) - config.context - 1
    return np.linspace(0, last, count).astype(np.int64)


def _loss(model: nn.Module, x: Tensor, y: Tensor | NDArray[Any]) -> Tensor:
    logits = model(x)
    return nn.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1))


# A training step: (windows, weight) -> loss, gradients left in .grad.
StepFunction = Callable[[NDArray[Any], NDArray[np.float32]], Tensor]


def _step_function(model: nn.Module, eager: bool, example: np.ndarray) -> StepFunction:
    """`(window, weight) -> loss`, leaving the gradients of `weight * loss` in `.grad`
    (`weight` a float32 scalar array: this process's share of the global batch, see
    `train_gpt`): eager autograd, or one TRAINING plan (this process's part of every
    batch keeps one shape, so one plan serves the whole run)."""
    if eager:
        def eager_step(window: NDArray[Any], weight: NDArray[np.float32]) -> Tensor:
            loss = _loss(model, tensor(window[:, :-1]), window[:, 1:])
            (loss * tensor(weight)).backward()
            return loss
        return eager_step

    def weighted_loss(x: Tensor, y: Tensor, weight: Tensor) -> tuple[Tensor, Tensor]:
        loss = _loss(model, x, y)
        return loss * weight, loss

    plan = compile(weighted_loss, example[:, :-1], example[:, 1:], np.ones((), np.float32),
                   mode=LoweringMode.TRAINING)

    def planned_step(window: NDArray[Any], weight: NDArray[np.float32]) -> Tensor:
        _, loss = plan(window[:, :-1], window[:, 1:], weight)
        return loss

    return planned_step


def evaluate(model: nn.Module, ids: np.ndarray, starts: np.ndarray,
             config: GPTConfig) -> float:
    """Mean loss per character over the validation windows, in eval mode."""
    model.eval()
    total = 0.0
    with no_grad():
        for first in range(0, len(starts), config.batch_size):
            window = _windows(ids, starts[first:first + config.batch_size], config.context)
            total += _loss(model, tensor(window[:, :-1]), window[:, 1:]).item() * len(window)
    model.train()
    return total / len(starts)


def generate(model: GPT, prompt: Iterable[int], tokens: int, *, temperature: float = 1.0,
             top_k: int | None = None, rng: np.random.Generator) -> list[int]:
    """`prompt` followed by `tokens` sampled ids: each from the softmax of the last
    position's logits, divided by `temperature` (0: the most likely id), among the
    `top_k` most likely when given.

    Decoding is incremental: the keys and values of the ids seen so far are cached
    (`GPT.step`), so each new id runs through the model alone. The model sees the ids
    from a window start: at first the last `context` ids of the prompt; when the
    window fills `context` positions, it restarts at the last `context // 2` ids (at
    least one), whose keys and values are computed again at positions 0.. (positions
    are learned embeddings of at most `context` rows). Until then every id is the one
    a full forward over all the ids gives; after, it is the one a full forward over the
    window gives, which sees between `context // 2` and `context` ids."""
    ids = list(prompt)
    model.eval()
    cache = model.new_cache()
    keep = max(1, model.context // 2)
    new = ids[-model.context:]  # the ids the cache has yet to see
    with no_grad():
        for _ in range(tokens):
            if cache.length + len(new) > model.context:
                cache.clear()
                new = ids[-keep:]
            logits = model.step(np.asarray(new, np.int64)[None], cache)
            logits = logits.numpy()[0, -1].astype(np.float64)
            new = [_pick(logits, temperature, top_k, rng)]
            ids += new
    return ids


def _pick(logits: np.ndarray, temperature: float, top_k: int | None,
          rng: np.random.Generator) -> int:
    """The next id from one position's logits (see `generate`)."""
    if temperature <= 0:
        return int(logits.argmax())
    logits = logits / temperature
    if top_k is not None and top_k < len(logits):
        logits[logits < np.sort(logits)[-top_k]] = -np.inf
    p = np.exp(logits - logits.max())
    return int(rng.choice(len(p), p=p / p.sum()))


def train_gpt(config: GPTConfig, *, resume: bool = False, overwrite: bool = False,
              progress: bool = True, log: Callable[[str], None] = print,
              stop_after: int | None = None, sample_tokens: int = 200) -> GPTResult:
    """Train, evaluate on the validation text each epoch, checkpoint each epoch, and
    end with a sample. Arguments as `training.train`'s.

    Under mpirun every process calls it and trains data-parallel as the digits job
    does: all draw the same batch starts from the run's one generator, each trains
    its contiguous part of every batch, and the gradients are averaged; rank 0 alone
    logs, evaluates, writes and samples, and every process returns its result."""
    config.check()
    procs = Processes.start()
    procs.check_batches(config.steps_per_epoch * config.batch_size, config.batch_size)
    say = log if procs.primary else quiet
    out = procs.agree(lambda: prepare_output(config.output, resume=resume,
                                             overwrite=overwrite))
    # Rank 0 reads the text and sends it: every process then trains on the same bytes
    # (another machine's standard library may differ) and only rank 0 needs the file.
    train_text, validation_text = procs.agree(lambda: load_texts(config))
    vocab = sorted(set(train_text) | set(validation_text))
    if resume:  # the vocabulary the run's weights were trained with (rank 0 reads it)
        seen = vocab
        vocab = procs.agree(lambda: training_metadata(out / CHECKPOINT)["extra"].get(
            "vocab", seen))
    train_ids, validation_ids = encode(train_text, vocab), encode(validation_text, vocab)
    validation_starts = _validation_starts(validation_ids, config)
    say(f"text: {len(train_ids):,} training and {len(validation_ids):,} validation "
        f"characters from {config.text or 'the standard library'}, {len(vocab)} distinct")
    with use_backend(BACKENDS[config.backend]()):
        creation.manual_seed(config.seed)
        model = GPT(len(vocab), config.context, config.width, config.heads, config.layers)
        optimizer = make_optimizer(config.optimizer, model.parameters(), config.lr,
                                   config.epochs * config.steps_per_epoch)
        history: list[Epoch] = []
        step = 0
        if resume:
            step, history = procs.agree(
                lambda: resume_run(out / CHECKPOINT, config, model, optimizer))
            say(f"resumed from {out / CHECKPOINT} after epoch {len(history)}")
        averaged = procs.share(model, optimizer)
        rng = creation.default_generator()  # rank 0's, on every process
        last_start = len(train_ids) - config.context - 1
        # This process's windows of each batch, and its share of the batch: the averaged
        # gradient is the global batch's mean when each process's mean loss is weighted
        # by its share times N (1 with one process, or equal parts).
        part = np.arange(config.batch_size)[procs.part(config.batch_size)]
        share = len(part) / config.batch_size
        weight = np.array(share * procs.size, dtype=np.float32)
        # The plan's example is not drawn from rng, so a resumed run draws what one
        # that never stopped would.
        example = _windows(train_ids, np.zeros(len(part), np.int64), config.context)
        step_fn = _step_function(model, config.eager, example)
        watchdog = procs.watchdog()
        started, trained_steps = time.perf_counter(), 0
        with procs.abort_on_error(), watchdog:
            for epoch in range(len(history), config.epochs):
                if stop_after is not None and epoch >= stop_after:
                    break
                loss_sum = 0.0  # this process's share of the batches' mean losses
                bar = progress_bar(range(config.steps_per_epoch), config.steps_per_epoch,
                                   epoch, config, progress and procs.primary)
                for done in bar:
                    fail_if_asked(procs.rank, step + 1)
                    starts = rng.integers(0, last_start + 1, config.batch_size)
                    averaged.zero_grad()
                    loss = step_fn(_windows(train_ids, starts[part], config.context), weight)
                    averaged.step()
                    watchdog.beat()
                    step += 1
                    trained_steps += 1
                    loss_sum += loss.item() * share
                    if progress and procs.primary and hasattr(bar, "set_postfix"):
                        # rank 0's part of the batches so far
                        bar.set_postfix(loss=f"{loss_sum / share / (done + 1):.4f}",
                                        refresh=False)
                train_loss = float(procs.sum([loss_sum])[0]) / config.steps_per_epoch
                if procs.primary:
                    validation_loss = evaluate(model, validation_ids, validation_starts,
                                               config)
                    history.append({"epoch": epoch + 1, "train_loss": train_loss,
                                    "test_loss": validation_loss})
                    log(f"epoch {epoch + 1}/{config.epochs}: train loss {train_loss:.4f}, "
                        f"validation loss {validation_loss:.4f}")
                    save_training(out / CHECKPOINT, model=model, optimizer=optimizer,
                                  step=step, rng=rng,
                                  extra={"history": history, "config": asdict(config),
                                         "vocab": vocab})
            elapsed = time.perf_counter() - started
            procs.check_same_parameters(model)
            final_loss: float | None = None
            text: str | None = None
            if procs.primary:
                save(model.state_dict(), out / "model.safetensors")
                plot_history(history, out / "history.png", log, held_out="validation")
                # The last epoch's figure, unless nothing was left to train.
                final_loss = history[-1]["test_loss"] if history else \
                    evaluate(model, validation_ids, validation_starts, config)
                prompt = b"def " if set(b"def ") <= set(vocab) else validation_text[:1]
                text = decode(generate(model, encode(prompt, vocab), sample_tokens,
                                       temperature=0.8, rng=np.random.default_rng(config.seed)),
                              vocab)
            final_loss, text, history = procs.from_primary(
                (final_loss, text, history))
            # rank 0's, which every process now holds
            assert final_loss is not None and text is not None
    rate = trained_steps / elapsed if elapsed > 0 else 0.0
    on = f" on {procs.size} processes" if procs.size > 1 else ""
    say(f"{trained_steps} steps in {elapsed:.1f} s ({rate:.1f} steps/s){on}; "
        f"checkpoint and weights in {out}/")
    return GPTResult(final_loss, text, history, model)


def load_for_sampling(folder: str) -> tuple[GPT, list[int]]:
    """The model and vocabulary of a GPT run's output folder (its training checkpoint)."""
    path = Path(folder) / CHECKPOINT
    if not path.is_file():
        raise ValueError(f"no checkpoint at {path}; train with `pullback train --model gpt "
                         f"--output {folder}` first")
    extra = training_metadata(path)["extra"]
    config, vocab = extra.get("config", {}), extra.get("vocab")
    if not isinstance(config, dict) or config.get("model") != MODEL or not vocab:
        raise ValueError(f"{path} is not a GPT run's checkpoint (made by "
                         f"`pullback train --model {config.get('model', '?')}`)")
    model = GPT(len(vocab), config["context"], config["width"], config["heads"],
                config["layers"])
    arrays, _ = read_arrays(path)
    model.load_state_dict({k.removeprefix("model/"): tensor(a) for k, a in arrays.items()
                           if k.startswith("model/")})
    return model, vocab


def sample(folder: str, prompt: str, tokens: int, *, temperature: float = 1.0,
           top_k: int | None = None, seed: int = 0) -> str:
    """The prompt and `tokens` characters sampled after it from the run in `folder`."""
    if tokens < 0 or temperature < 0 or (top_k is not None and top_k < 1):
        raise ValueError(f"--tokens and --temperature must be >= 0 and --top-k >= 1, got "
                         f"{tokens}, {temperature} and {top_k}")
    model, vocab = load_for_sampling(folder)
    ids = encode(prompt.encode(), vocab) if prompt else np.array([vocab.index(10)]
                                                                   if 10 in vocab else [0])
    out = generate(model, list(ids), tokens, temperature=temperature, top_k=top_k,
                   rng=np.random.default_rng(seed))
    return decode(out if prompt else out[1:], vocab)
