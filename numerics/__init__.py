"""numerics: the model of SPEC.md in PyTorch (prompts, full model, exact finite-L reduced
model, gradient-flow trainer).  See docs/numerics.md.

``numerics.train`` is imported lazily (on first use of its names) so that
``python -m numerics.train`` does not import the module twice.
"""
from __future__ import annotations

import importlib

from .config import ProblemConfig
from .data import Prompts, make_generator, sample_prompts
from .model import MultiHeadAttention, Readout, initial_semi_singular_values, mse_loss
from .reduced import metric_factors, reduced_loss, reduced_predict

_TRAIN_NAMES = ("TrainConfig", "Record", "TrainResult", "TrainingDiverged", "train", "train_reduced")

__all__ = ["ProblemConfig", "Prompts", "make_generator", "sample_prompts", "MultiHeadAttention",
           "Readout", "initial_semi_singular_values", "mse_loss", "metric_factors", "reduced_loss",
           "reduced_predict", *_TRAIN_NAMES]


def __getattr__(name):
    if name in _TRAIN_NAMES:
        return getattr(importlib.import_module(".train", __name__), name)
    raise AttributeError(f"module 'numerics' has no attribute {name!r}")
