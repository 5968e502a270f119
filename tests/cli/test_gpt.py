"""`pullback train --model gpt` and `pullback sample`, through the command, tiny settings."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pullback as pb
from pullback import gpt
from pullback.cli import main
from pullback.gpt import decode, encode

TINY = ["--model", "gpt", "--batch-size", "4", "--steps-per-epoch", "3", "--context", "8",
        "--width", "8", "--heads", "2", "--layers", "1", "--no-progress"]


def _text(tmp_path: Path) -> Path:
    path = tmp_path / "text.txt"
    path.write_text("def add(a, b):\n    return a + b\n\n" * 40)
    return path


def test_train_writes_checkpoint_and_plot_resumes_and_samples(tmp_path: Path,
                                                              capsys) -> None:
    run = tmp_path / "run"
    args = [*TINY, "--text", str(_text(tmp_path)), "--output", str(run)]
    assert main(["train", *args, "--epochs", "2"]) == 0
    out = capsys.readouterr().out
    lines = out.strip().splitlines()
    assert re.fullmatch(r"validation loss: \d+\.\d{4}", lines[-1]), lines[-1]
    first = float(lines[-1].split(": ")[1])
    assert 0 < first < np.log(256)  # a loss per character, below that of guessing a byte
    assert "epoch 2/2: train loss" in out and "sample:" in out
    assert (run / "checkpoint.safetensors").is_file()
    assert (run / "history.png").stat().st_size > 0
    assert set(pb.load(run / "model.safetensors")) >= {"tokens.weight", "head.weight"}

    # Resuming with other settings is refused, naming the difference (as the digits job).
    assert main(["train", *args, "--epochs", "4", "--resume"]) == 2
    assert "other settings" in capsys.readouterr().err

    assert main(["sample", "--checkpoint", str(run), "--prompt", "def ", "--tokens", "12",
                 "--temperature", "0.8", "--top-k", "5", "--seed", "1"]) == 0
    text = capsys.readouterr().out
    assert text.startswith("def ") and len(text.rstrip("\n")) >= len("def ")
    # The same seed samples the same text.
    main(["sample", "--checkpoint", str(run), "--prompt", "def ", "--tokens", "12",
          "--temperature", "0.8", "--top-k", "5", "--seed", "1"])
    assert capsys.readouterr().out == text


def test_an_interrupted_gpt_run_resumed_matches_one_that_never_stopped(
        tmp_path: Path, capsys) -> None:
    text = str(_text(tmp_path))
    straight, split = tmp_path / "a", tmp_path / "b"
    common = [*TINY, "--text", text, "--epochs", "2", "--eager"]
    assert main(["train", *common, "--output", str(straight)]) == 0
    expected = capsys.readouterr().out.strip().splitlines()[-1]
    from pullback.gpt import GPTConfig, train_gpt

    config = GPTConfig(text=text, epochs=2, batch_size=4, steps_per_epoch=3, context=8,
                       width=8, heads=2, layers=1, eager=True, output=str(split))
    train_gpt(config, progress=False, log=lambda _: None, stop_after=1)
    assert main(["train", *common, "--output", str(split), "--resume"]) == 0
    assert capsys.readouterr().out.strip().splitlines()[-1] == expected
    a, b = pb.load(straight / "model.safetensors"), pb.load(split / "model.safetensors")
    for name in a:
        np.testing.assert_array_equal(a[name].numpy(), b[name].numpy(), err_msg=name)


def test_sample_refuses_a_folder_without_a_gpt_run(tmp_path: Path, capsys) -> None:
    assert main(["sample", "--checkpoint", str(tmp_path), "--prompt", "x"]) == 2
    assert "no checkpoint" in capsys.readouterr().err


def test_the_standard_library_splits_by_file_and_bytes_round_trip(monkeypatch) -> None:
    monkeypatch.setattr(gpt, "STDLIB_CHARS", 300_000)  # enough files, less reading
    train, validation = gpt.stdlib_texts()
    assert (train, validation) == gpt.stdlib_texts()  # the same split every time
    assert len(train) > 8 * len(validation) > 0
    assert b"def " in train and b"def " in validation
    assert validation not in train  # whole files on one side
    vocab = sorted(set(b"def f(x):\n"))
    assert decode(encode(b"def f(x):\n", vocab), vocab) == "def f(x):\n"
    with pytest.raises(ValueError, match="not in the run's vocabulary"):
        encode(b"z", vocab)


def test_the_training_plan_and_eager_autograd_train_alike(tmp_path: Path) -> None:
    from pullback.gpt import GPTConfig, train_gpt

    text = str(_text(tmp_path))
    losses = []
    for eager in (False, True):
        config = GPTConfig(text=text, epochs=1, batch_size=4, steps_per_epoch=3, context=8,
                           width=8, heads=2, layers=1, eager=eager,
                           output=str(tmp_path / str(eager)))
        result = train_gpt(config, progress=False, log=lambda _: None, sample_tokens=0)
        losses.append([result.history[0]["train_loss"], result.validation_loss])
    np.testing.assert_allclose(losses[0], losses[1], rtol=1e-4)
