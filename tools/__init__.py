"""Tools beside the library: the parameter sweep runner (:mod:`tools.sweep`), the training-step
benchmark (:mod:`tools.bench`) and its standard-way baseline (:mod:`tools.reference`).

They use ``numerics`` (the trainer, the model, the data) and nothing uses them but the
claims that read sweep results, the command line and the tests; the library does not
import them.
"""
from audit_io.command import refuse_a_deleted_cwd_at_startup

refuse_a_deleted_cwd_at_startup()   # `python -m tools.X` from a deleted directory: a message, not torch's abort
