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

Every name is imported lazily (on first use): importing the package loads no torch, so its
ground floor ``numerics.io`` (options, files, the command wrapper) serves theory's command line
too, and ``python -m numerics.train`` does not import the module twice.
"""
from __future__ import annotations

import importlib

from numerics.io import refuse_a_deleted_cwd_at_startup

refuse_a_deleted_cwd_at_startup()   # `python -m numerics.X` from a deleted directory: a message, not torch's abort

_LAZY = {
    "config": ("ProblemConfig", "check_device", "use_precise_float32"),
    "data": ("Prompts", "make_generator", "sample_prompts"),
    "model": ("MultiHeadAttention", "Readout", "TrainingDiverged", "full_velocity_on_D", "initial_semi_singular_values",
              "mse_loss"),
    "reduced": ("attention_weights", "block_scores", "metric_factors", "per_prompt_reduced_gradients",
                "per_prompt_reduced_losses", "predict_from_scores", "reduced_gradient", "reduced_loss", "reduced_predict"),
    "symmetry": ("symmetrize_full",),
    "evaluate": ("LossEstimate", "held_out_loss", "held_out_reduced_loss"),
    "train": ("TrainConfig", "Record", "TrainResult", "train", "train_reduced", "train_many"),
    "exact_reduced": ("evaluate", "measure", "allocated_minimum", "single_head_minimum", "best_found_minimum",
                      "minimise_family", "optimal_mu_at", "loss_and_gradient", "FamilyMinimum"),
}
_OWNER = {name: module for module, names in _LAZY.items() for name in names}

__all__ = list(_OWNER)


def __getattr__(name):
    if name in _OWNER:
        return getattr(importlib.import_module(f".{_OWNER[name]}", __name__), name)
    raise AttributeError(f"module 'numerics' has no attribute {name!r}")
