"""Training checkpoints: model, optimizer, step, RNG and extras round-trip, and a run
interrupted and resumed from a checkpoint ends bit-for-bit where an unbroken run does.

The model and optimizer are small stand-ins with the duck-typed interface the real
nn and optim classes provide (state_dict / load_state_dict)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from safetensors.numpy import save_file

import pullback as pb
from pullback.io import CheckpointError, load_training, save_training


class StandInModel:
    """A parameter vector, a matrix and an integer buffer, stored as tensors."""

    def __init__(self, seed: int) -> None:
        rng = np.random.default_rng(seed)
        self.params = {"w": pb.tensor(rng.standard_normal(5)),
                       "layer.kernel": pb.tensor(rng.standard_normal((2, 3)).astype(np.float32)),
                       "counter": pb.tensor(np.array(0, dtype=np.int64))}

    def state_dict(self) -> dict[str, pb.Tensor]:
        return dict(self.params)

    def load_state_dict(self, state: dict[str, pb.Tensor]) -> None:
        self.params = {name: pb.tensor(np.array(value.numpy())) for name, value in state.items()}


class StandInOptimizer:
    """Momentum SGD whose state is a flat dict of arrays, created lazily at the first step."""

    def __init__(self, lr: float = 0.1, momentum: float = 0.9) -> None:
        self.lr, self.momentum = lr, momentum
        self.state: dict[str, np.ndarray] = {}

    def state_dict(self) -> dict[str, np.ndarray]:
        return dict(self.state)

    def load_state_dict(self, state: dict[str, np.ndarray]) -> None:
        self.state = {name: np.array(value) for name, value in state.items()}

    def step(self, model: StandInModel, rng: np.random.Generator) -> None:
        # Deterministic update driven by RNG draws, so a wrong RNG restore shows.
        for name in ("w", "layer.kernel"):
            value = model.params[name].numpy()
            grad = value - rng.standard_normal(value.shape).astype(value.dtype)
            buffer = self.state.get(f"momentum.{name}", np.zeros_like(value))
            buffer = self.momentum * buffer + grad
            self.state[f"momentum.{name}"] = buffer.astype(value.dtype)
            model.params[name] = pb.tensor(value - self.lr * buffer.astype(value.dtype))
        counter = model.params["counter"].numpy()
        model.params["counter"] = pb.tensor(counter + 1)
        self.state["steps"] = np.array(counter + 1)


def _assert_same(a: StandInModel, b: StandInModel, oa: StandInOptimizer,
                 ob: StandInOptimizer) -> None:
    assert a.params.keys() == b.params.keys() and oa.state.keys() == ob.state.keys()
    for name in a.params:
        assert a.params[name].dtype == b.params[name].dtype
        assert a.params[name].numpy().tobytes() == b.params[name].numpy().tobytes()
    for name in oa.state:
        assert oa.state[name].dtype == ob.state[name].dtype
        assert oa.state[name].tobytes() == ob.state[name].tobytes()


def test_round_trip_restores_everything(tmp_path: Path) -> None:
    model, optimizer, rng = StandInModel(0), StandInOptimizer(), np.random.default_rng(42)
    for _ in range(3):
        optimizer.step(model, rng)
    extra = {"epoch": 2, "best_accuracy": 0.9812, "history": [1.5, 0.75], "tag": {"run": "a"}}
    path = tmp_path / "train.safetensors"
    save_training(path, model=model, optimizer=optimizer, step=3, rng=rng, extra=extra)

    fresh_model, fresh_optimizer = StandInModel(1), StandInOptimizer()
    restored = load_training(path, model=fresh_model, optimizer=fresh_optimizer)
    assert restored["step"] == 3 and isinstance(restored["step"], int)
    assert restored["extra"] == extra
    assert isinstance(restored["rng"], np.random.Generator)
    np.testing.assert_array_equal(restored["rng"].standard_normal(10), rng.standard_normal(10))
    assert restored["rng"].integers(0, 2**62) == rng.integers(0, 2**62)
    _assert_same(model, fresh_model, optimizer, fresh_optimizer)
    assert all(isinstance(t, pb.Tensor) and not t.requires_grad
               for t in fresh_model.params.values())


def test_tensors_are_stored_under_model_and_optim_prefixes(tmp_path: Path) -> None:
    model, optimizer = StandInModel(0), StandInOptimizer()
    optimizer.step(model, np.random.default_rng(0))
    path = tmp_path / "train.safetensors"
    save_training(path, model=model, optimizer=optimizer, step=1)
    assert set(pb.load(path)) == {"model/w", "model/layer.kernel", "model/counter",
                                  "optim/momentum.w", "optim/momentum.layer.kernel",
                                  "optim/steps"}


def test_without_rng_or_extra(tmp_path: Path) -> None:
    path = tmp_path / "train.safetensors"
    save_training(path, model=StandInModel(0), optimizer=StandInOptimizer(), step=0)
    restored = load_training(path, model=StandInModel(1), optimizer=StandInOptimizer())
    assert restored == {"step": 0, "rng": None, "extra": {}}


@pytest.mark.parametrize("bit_generator", [np.random.PCG64, np.random.PCG64DXSM,
                                           np.random.MT19937, np.random.Philox,
                                           np.random.SFC64], ids=lambda c: c.__name__)
def test_every_numpy_bit_generator_resumes_its_stream(tmp_path: Path,
                                                      bit_generator: type) -> None:
    rng = np.random.Generator(bit_generator(7))
    rng.integers(0, 10, size=3, dtype=np.uint32)  # leaves a buffered half-word in the state
    path = tmp_path / "train.safetensors"
    save_training(path, model=StandInModel(0), optimizer=StandInOptimizer(), step=5, rng=rng)
    restored = load_training(path, model=StandInModel(0), optimizer=StandInOptimizer())["rng"]
    assert type(restored.bit_generator) is bit_generator
    np.testing.assert_array_equal(restored.integers(0, 1000, size=20, dtype=np.uint32),
                                  rng.integers(0, 1000, size=20, dtype=np.uint32))
    np.testing.assert_array_equal(restored.random(20), rng.random(20))


def _train(model: StandInModel, optimizer: StandInOptimizer, rng: np.random.Generator,
           steps: range) -> None:
    for _ in steps:
        optimizer.step(model, rng)


def test_interrupted_and_resumed_run_matches_an_unbroken_run_bit_for_bit(tmp_path: Path) -> None:
    total, interrupt_at = 12, 5
    unbroken_model, unbroken_optimizer = StandInModel(0), StandInOptimizer()
    _train(unbroken_model, unbroken_optimizer, np.random.default_rng(123), range(total))

    model, optimizer, rng = StandInModel(0), StandInOptimizer(), np.random.default_rng(123)
    _train(model, optimizer, rng, range(interrupt_at))
    path = tmp_path / "train.safetensors"
    save_training(path, model=model, optimizer=optimizer, step=interrupt_at, rng=rng)
    del model, optimizer, rng  # the process "dies" here

    resumed_model, resumed_optimizer = StandInModel(99), StandInOptimizer()
    state = load_training(path, model=resumed_model, optimizer=resumed_optimizer)
    _train(resumed_model, resumed_optimizer, state["rng"], range(state["step"], total))
    _assert_same(unbroken_model, resumed_model, unbroken_optimizer, resumed_optimizer)
    assert int(resumed_model.params["counter"].numpy()) == total


def test_plain_weights_file_is_not_a_training_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "weights.safetensors"
    pb.save({"w": np.zeros(5)}, path)
    with pytest.raises(CheckpointError, match="not a training checkpoint") as error:
        load_training(path, model=StandInModel(0), optimizer=StandInOptimizer())
    assert str(path) in str(error.value)


def test_mismatched_model_is_reported_and_left_untouched(tmp_path: Path) -> None:
    path = tmp_path / "train.safetensors"
    save_training(path, model=StandInModel(0), optimizer=StandInOptimizer(), step=1)
    other = StandInModel(1)
    other.params["w"] = pb.tensor(np.zeros(7))
    other.params["extra.bias"] = pb.tensor(np.zeros(2))
    before = {name: t.numpy().copy() for name, t in other.params.items()}
    with pytest.raises(CheckpointError) as error:
        load_training(path, model=other, optimizer=StandInOptimizer())
    message = str(error.value)
    assert str(path) in message and "'extra.bias'" in message
    assert "'w': expected (7,) float64, got (5,) float64" in message
    for name, value in before.items():
        np.testing.assert_array_equal(other.params[name].numpy(), value)


def test_missing_and_corrupt_training_files(tmp_path: Path) -> None:
    with pytest.raises(CheckpointError, match="no such file"):
        load_training(tmp_path / "gone", model=StandInModel(0), optimizer=StandInOptimizer())
    path = tmp_path / "train.safetensors"
    save_training(path, model=StandInModel(0), optimizer=StandInOptimizer(), step=1,
                  rng=np.random.default_rng(0))
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(CheckpointError, match="truncated or corrupt"):
        load_training(path, model=StandInModel(0), optimizer=StandInOptimizer())


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"step": -1}, "step must be a non-negative int"),
    ({"step": 1.5}, "step must be a non-negative int"),
    ({"step": True}, "step must be a non-negative int"),
    ({"step": 2**63}, "does not fit an int64"),
    ({"step": 1, "rng": np.random.RandomState(0)}, "rng must be a np.random.Generator"),
    ({"step": 1, "extra": {"f": object()}}, "not JSON-serializable"),
    ({"step": 1, "extra": {1: "a"}}, "keys must be strings"),
    ({"step": 1, "extra": [1, 2]}, "not a dict"),
], ids=["negative-step", "float-step", "bool-step", "int64-overflow-step", "legacy-rng",
        "object-extra", "int-key-extra", "list-extra"])
def test_bad_arguments_are_rejected_before_writing(tmp_path: Path, kwargs: dict,
                                                   match: str) -> None:
    path = tmp_path / "train.safetensors"
    with pytest.raises(CheckpointError, match=match) as error:
        save_training(path, model=StandInModel(0), optimizer=StandInOptimizer(), **kwargs)
    assert str(path) in str(error.value)
    assert not path.exists()


def test_optimizer_value_that_is_not_an_array_names_its_key(tmp_path: Path) -> None:
    optimizer = StandInOptimizer()
    optimizer.state["lr"] = 0.1  # type: ignore[assignment]
    with pytest.raises(CheckpointError, match="'optim/lr' is a float"):
        save_training(tmp_path / "t.safetensors", model=StandInModel(0), optimizer=optimizer,
                      step=1)


@pytest.mark.parametrize("metadata", [
    {"pullback.kind": "training", "pullback.step": "three"},
    {"pullback.kind": "training"},
    {"pullback.kind": "training", "pullback.step": "1", "pullback.rng": "{not json"},
    {"pullback.kind": "training", "pullback.step": "1", "pullback.extra": "[1]"},
], ids=["bad-step", "no-step", "bad-rng", "extra-not-dict"])
def test_corrupt_training_metadata(tmp_path: Path, metadata: dict[str, str]) -> None:
    path = tmp_path / "train.safetensors"
    save_file({"model/w": np.zeros(5)}, str(path), metadata=metadata)
    with pytest.raises(CheckpointError, match="corrupt training metadata") as error:
        load_training(path, model=StandInModel(0), optimizer=StandInOptimizer())
    assert str(path) in str(error.value)


def test_tensors_outside_model_and_optim_are_rejected(tmp_path: Path) -> None:
    path = tmp_path / "train.safetensors"
    save_file({"stray": np.zeros(5)}, str(path),
              metadata={"pullback.kind": "training", "pullback.step": "1"})
    with pytest.raises(CheckpointError, match="outside model/ and optim/"):
        load_training(path, model=StandInModel(0), optimizer=StandInOptimizer())


def test_a_bad_optimizer_state_leaves_the_model_untouched(tmp_path: Path) -> None:
    from pullback import nn, optim

    path = tmp_path / "train.safetensors"
    model = nn.Dense(3, 2)
    saved_state = optim.Adam(model.parameters(), 0.1).state_dict()
    del saved_state["step_count"]  # the optimizer part of the file lacks a required key
    save_training(path, model=model, optimizer=_Fixed(saved_state), step=1)

    other = nn.Dense(3, 2)
    optimizer = optim.Adam(other.parameters(), 0.1)
    before = {name: p.numpy().copy() for name, p in other.named_parameters()}
    with pytest.raises(CheckpointError, match=r"optimizer state.*step_count") as error:
        load_training(path, model=other, optimizer=optimizer)
    assert str(path) in str(error.value)
    for name, p in other.named_parameters():
        np.testing.assert_array_equal(p.numpy(), before[name], err_msg=name)
    assert not any(k.startswith("state.") for k in optimizer.state_dict())


def test_a_model_that_refuses_its_state_gets_the_optimizer_state_back(tmp_path: Path) -> None:
    path = tmp_path / "train.safetensors"
    optimizer = StandInOptimizer()
    optimizer.step(StandInModel(0), np.random.default_rng(0))
    save_training(path, model=StandInModel(0), optimizer=optimizer, step=1)

    class Refusing(StandInModel):
        def load_state_dict(self, state: dict) -> None:
            raise ValueError("refused")

    fresh = StandInOptimizer()
    with pytest.raises(CheckpointError, match=r"model state.*refused"):
        load_training(path, model=Refusing(1), optimizer=fresh)
    assert fresh.state == {}


class _Fixed:
    """An optimizer stand-in with a given state dict."""

    def __init__(self, state: dict) -> None:
        self.state = state

    def state_dict(self) -> dict:
        return self.state


class _ArrayModel:
    """A model whose state is NumPy arrays of every dtype a checkpoint stores."""

    def __init__(self, fill: int) -> None:
        self.state = {np.dtype(t).name: np.full(3, fill, dtype=t)
                      for t in (np.float16, np.float32, np.uint8, np.int16, np.bool_)}

    def state_dict(self) -> dict:
        return dict(self.state)

    def load_state_dict(self, state: dict) -> None:
        self.state = dict(state)


def test_every_storable_dtype_round_trips_through_a_training_checkpoint(tmp_path: Path) -> None:
    # float16 is one pb.tensor refuses to make; loading must not go through it.
    path = tmp_path / "train.safetensors"
    save_training(path, model=_ArrayModel(1), optimizer=StandInOptimizer(), step=1)
    fresh = _ArrayModel(0)
    load_training(path, model=fresh, optimizer=StandInOptimizer())
    for name, value in fresh.state.items():
        assert isinstance(value, pb.Tensor) and value.dtype == np.dtype(name)
        np.testing.assert_array_equal(value.numpy(), np.ones(3, dtype=name))


def test_extra_nested_too_deeply_is_a_checkpoint_error(tmp_path: Path) -> None:
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    path = tmp_path / "train.safetensors"
    with pytest.raises(CheckpointError, match="nested too deeply") as error:
        save_training(path, model=StandInModel(0), optimizer=StandInOptimizer(), step=1,
                      extra={"deep": deep})
    assert str(path) in str(error.value) and not path.exists()
