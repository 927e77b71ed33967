"""numerics: the model of docs/model.md in PyTorch (see docs/numerics.md and docs/ARCHITECTURE.md).

Modules: ``config`` (the problem: ProblemConfig and its prompts), ``model`` (the full model,
its readout on D, the exact finite-L reduced model on (omega, mu), exact symmetrisation of a
batch), ``exact_reduced`` (the reduced loss by Rao-Blackwellised Monte Carlo and its
minimisers), ``train`` (the one gradient-descent loop: single runs and many runs as one
batched program; ``python -m numerics.train``), ``evaluate`` (held-out losses of trained
weights, the allocation readout of (omega, mu), and the estimators of the precision of what is
measured: means and standard errors, fits, extrapolations, binomial intervals), ``engine``
(needs, their seeds by identity and their priced cost).

Importing the package loads no torch: its ground floor ``numerics.io`` (options, files, the
command wrapper) serves theory's command line too.
"""
from numerics.io import refuse_a_deleted_cwd_at_startup

refuse_a_deleted_cwd_at_startup()   # `python -m numerics.X` from a deleted directory: a message, not torch's abort
