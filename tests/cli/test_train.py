"""`pullback train`: a shortened run converges, resuming is exact, the CLI's contract."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

import pullback as pb
from pullback.cli import main
from pullback.training import TrainConfig, build_model, make_optimizer, train


def _quiet(message: str) -> None:
    pass


def test_a_shortened_run_converges(tmp_path: Path) -> None:
    result = train(TrainConfig(epochs=4, output=str(tmp_path)), progress=False, log=_quiet)
    losses = [h["train_loss"] for h in result.history]
    assert losses == sorted(losses, reverse=True)  # falls every epoch
    assert result.test_accuracy >= 0.9
    assert (tmp_path / "checkpoint.safetensors").exists()
    weights = pb.load(tmp_path / "model.safetensors")
    assert set(weights) == {n for n, _ in result.model.named_parameters()}


def test_the_mlp_trains_with_every_optimizer(tmp_path: Path) -> None:
    for name in ("sgd", "momentum", "rmsprop", "adamw"):
        lr = 0.05 if name in ("sgd", "momentum") else 2e-3
        result = train(TrainConfig(model="mlp", epochs=2, lr=lr, optimizer=name,
                                   output=str(tmp_path / name)), progress=False, log=_quiet)
        assert result.test_accuracy > 0.5, name


def test_an_interrupted_run_resumed_ends_bit_for_bit_like_an_uninterrupted_one(
        tmp_path: Path) -> None:
    config = {"epochs": 3, "batch_size": 64}
    straight = train(TrainConfig(output=str(tmp_path / "a"), **config), progress=False,
                     log=_quiet)
    train(TrainConfig(output=str(tmp_path / "b"), **config), progress=False, log=_quiet,
          stop_after=1)
    resumed = train(TrainConfig(output=str(tmp_path / "b"), **config), resume=True,
                    progress=False, log=_quiet)
    for (name, p), q in zip(straight.model.named_parameters(), resumed.model.parameters()):
        np.testing.assert_array_equal(p.numpy(), q.numpy(), err_msg=name)
    assert [h["test_accuracy"] for h in resumed.history] == \
        [h["test_accuracy"] for h in straight.history]


def test_resume_refuses_a_checkpoint_made_with_other_settings(tmp_path: Path) -> None:
    train(TrainConfig(epochs=1, output=str(tmp_path)), progress=False, log=_quiet)
    with pytest.raises(ValueError, match=r"other settings.*lr"):
        train(TrainConfig(epochs=1, lr=0.5, output=str(tmp_path)), resume=True,
              progress=False, log=_quiet)


def test_command_prints_the_test_accuracy_last(tmp_path: Path, capsys) -> None:
    code = main(["train", "--epochs", "1", "--model", "mlp", "--no-progress",
                 "--output", str(tmp_path)])
    assert code == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"test accuracy: 0\.\d{4}", last), last


def test_command_resume_without_a_checkpoint_is_a_clear_error(tmp_path: Path, capsys) -> None:
    code = main(["train", "--resume", "--no-progress", "--output", str(tmp_path / "none")])
    assert code == 2
    assert "no checkpoint at" in capsys.readouterr().err


@pytest.mark.parametrize("field, value, match", [
    ("model", "vgg", "model must be one of"), ("optimizer", "lbfgs", "optimizer must be"),
    ("epochs", 0, "epochs and batch size"), ("backend", "gpu", "backend must be"),
])
def test_bad_settings_are_clear_errors(tmp_path: Path, field: str, value, match: str) -> None:
    config = TrainConfig(output=str(tmp_path))
    setattr(config, field, value)
    with pytest.raises(ValueError, match=match):
        train(config, progress=False, log=_quiet)


def test_the_plot_of_loss_and_accuracy_is_a_png(tmp_path: Path) -> None:
    train(TrainConfig(epochs=2, model="mlp", output=str(tmp_path)), progress=False, log=_quiet)
    assert (tmp_path / "history.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_the_training_plan_and_eager_autograd_train_alike(tmp_path: Path) -> None:
    results = [train(TrainConfig(epochs=2, model="mlp", eager=eager,
                                 output=str(tmp_path / str(eager))), progress=False, log=_quiet)
               for eager in (False, True)]
    for (name, p), q in zip(results[0].model.named_parameters(), results[1].model.parameters()):
        np.testing.assert_allclose(p.numpy(), q.numpy(), rtol=1e-4, atol=1e-6, err_msg=name)


def test_resume_refuses_a_checkpoint_without_the_random_generator(tmp_path: Path,
                                                                   capsys) -> None:
    # save_training's rng is optional; resuming without it used to raise a TypeError
    # (set_default_generator(None)) after loading the weights, a traceback at the CLI.
    train(TrainConfig(epochs=1, output=str(tmp_path)), progress=False, log=_quiet)
    checkpoint = tmp_path / "checkpoint.safetensors"
    model = build_model("cnn")
    optimizer = make_optimizer("adam", model.parameters(), 2e-3, 45)
    info = pb.io.load_training(checkpoint, model=model, optimizer=optimizer)
    pb.io.save_training(checkpoint, model=model, optimizer=optimizer, step=info["step"],
                        extra=info["extra"])
    code = main(["train", "--resume", "--no-progress", "--epochs", "1",
                 "--output", str(tmp_path)])
    assert code == 2
    assert "holds no random generator state" in capsys.readouterr().err
