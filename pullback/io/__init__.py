"""Checkpoints (safetensors, atomic writes, no pickle) and the bundled datasets.

`pb.save`/`pb.load` store state dicts; `save_training`/`load_training` store a
resumable run; `datasets` holds the digits data, the split and mini-batching.
"""

from .checkpoint import load, save
from .datasets import batches, digits_split, load_digits, train_test_split
from .errors import CheckpointError
from .state_check import check_state_dict
from .training import load_training, save_training, training_metadata

__all__ = [
    "CheckpointError",
    "batches",
    "check_state_dict",
    "digits_split",
    "load",
    "load_digits",
    "load_training",
    "save",
    "save_training",
    "train_test_split",
    "training_metadata",
]
