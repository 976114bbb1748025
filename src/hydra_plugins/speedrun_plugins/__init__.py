"""speedrun's Hydra plugins: the local GPU-pool launcher (``hydra/launcher=pool``) and the sweeper that adds
resume and fail-fast to Hydra's basic sweeper (``hydra/sweeper=speedrun``). conf/config.yaml selects both.
``optuna_sweeper`` is the adaptive sweeper on Optuna's API (``hydra/sweeper=optuna``): persisted, resumable studies
and pruning from the runs' periodic validation.
``slurm_launcher`` extends hydra-submitit-launcher's SLURM launcher (``hydra/launcher=slurm``) so that a preempted
job is requeued with ``resume=<run dir>``.

``hydra_plugins`` is a namespace package (no ``__init__.py``): Hydra scans it for plugins at start-up, so these
modules import nothing heavy.
"""
