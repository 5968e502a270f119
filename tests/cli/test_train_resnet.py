"""`pullback train --model resnet`: the BatchNorm ResNet trains through a TRAINING plan,
its running statistics are in the checkpoint and weights, and resuming restores them."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np

import pullback as pb
from pullback import training
from pullback.cli import main
from pullback.io import digits_split
from pullback.training import TrainConfig, evaluate, resnet, train

SPLIT = tuple(a[:n] for a, n in zip(digits_split(), (256, 256, 100, 100)))


def test_resnet_trains_checkpoints_its_statistics_and_resumes(tmp_path: Path, capsys,
                                                              monkeypatch) -> None:
    # A part of the digits keeps the two short runs quick; the model is the job's own.
    monkeypatch.setattr(training, "digits_split", lambda: SPLIT)
    settings = {"model": "resnet", "epochs": 2, "batch_size": 64, "lr": 5e-3}
    first = train(TrainConfig(output=str(tmp_path), **settings), progress=False,
                  log=lambda message: None, stop_after=1)
    _, _, x_test, y_test = SPLIT
    steps = 256 // 64
    weights = pb.load(tmp_path / "model.safetensors")
    assert int(weights["1.num_batches_tracked"].item()) == steps  # the plan counted each
    assert not np.allclose(weights["1.running_mean"].numpy(), 0.0)  # and updated them
    # The saved statistics are the ones eval mode used: a fresh model loading the
    # weights scores what the run did.
    model = resnet()
    model.load_state_dict(weights)
    assert evaluate(model, x_test, y_test)[1] == first.test_accuracy
    # Resuming continues from the checkpoint's statistics (a fresh counter would end at
    # one epoch's steps).
    code = main(["train", "--model", "resnet", "--epochs", "2", "--batch-size", "64", "--lr",
                 "5e-3", "--resume", "--no-progress", "--output", str(tmp_path)])
    assert code == 0
    last = capsys.readouterr().out.strip().splitlines()[-1]
    assert re.fullmatch(r"test accuracy: 0\.\d{4}", last), last
    resumed = pb.load(tmp_path / "model.safetensors")
    assert int(resumed["1.num_batches_tracked"].item()) == 2 * steps
