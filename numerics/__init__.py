"""numerics: the model of docs/model.md in PyTorch -- prompts, the full model, the exact finite-L
reduced model and its Rao-Blackwellised estimator, and the one gradient-descent loop.
See docs/numerics.md and docs/ARCHITECTURE.md.

Modules: ``config`` (ProblemConfig, check_device, use_precise_float32), ``data`` (prompts),
``model`` (MultiHeadAttention, readout, merged_gradients, TrainingDiverged), ``reduced``
(the reduced model's prediction on per-block scores, its loss and gradients, the metric
factors), ``exact_reduced`` (the exact reduced loss by Rao-Blackwellised Monte Carlo and its
minimisers), ``evaluate`` (held-out loss of final weights on fresh prompts, with its
standard error), ``symmetry`` (exact symmetrisation of a batch), ``train`` (the trainer;
``train_many``: many runs as one batched program, through ``batched``).

``numerics.train`` and ``numerics.exact_reduced`` are imported lazily (on first use of their
names): ``python -m numerics.train`` must not import the module twice, and the estimator
pulls in scipy.optimize, which a training run does not need.
"""
from __future__ import annotations

import importlib

from audit_io.command import refuse_a_deleted_cwd_at_startup

refuse_a_deleted_cwd_at_startup()   # `python -m numerics.X` from a deleted directory: a message, not torch's abort

from .config import ProblemConfig, check_device, use_precise_float32
from .data import Prompts, make_generator, sample_prompts
from .model import (MultiHeadAttention, Readout, TrainingDiverged, full_velocity_on_D, initial_semi_singular_values,
                    mse_loss)
from .reduced import (attention_weights, block_scores, metric_factors, per_prompt_reduced_gradients,
                      per_prompt_reduced_losses, predict_from_scores, reduced_gradient, reduced_loss, reduced_predict)
from .symmetry import symmetrize_full
from .evaluate import LossEstimate, held_out_loss, held_out_reduced_loss

_LAZY = {
    "train": ("TrainConfig", "Record", "TrainResult", "train", "train_reduced", "train_many"),
    "exact_reduced": ("evaluate", "measure", "allocated_minimum", "single_head_minimum", "best_found_minimum",
                      "minimise_family", "exact_minima", "optimal_mu_at", "loss_and_gradient", "FamilyMinimum"),
}
_OWNER = {name: module for module, names in _LAZY.items() for name in names}

__all__ = ["ProblemConfig", "check_device", "use_precise_float32", "Prompts", "make_generator", "sample_prompts",
           "MultiHeadAttention", "Readout", "TrainingDiverged", "full_velocity_on_D", "initial_semi_singular_values",
           "mse_loss", "attention_weights", "block_scores", "metric_factors", "per_prompt_reduced_gradients",
           "per_prompt_reduced_losses", "predict_from_scores", "reduced_gradient", "reduced_loss", "reduced_predict",
           "symmetrize_full", "LossEstimate", "held_out_loss", "held_out_reduced_loss", *_OWNER]


def __getattr__(name):
    if name in _OWNER:
        return getattr(importlib.import_module(f".{_OWNER[name]}", __name__), name)
    raise AttributeError(f"module 'numerics' has no attribute {name!r}")
