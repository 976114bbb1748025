"""`python -m run [group=option ...]`: compose the config with Hydra and hand it to speedrun. Nothing else."""

# ruff: noqa: E402 - the imports below come after the sys.path line, which must run before any can reach the cwd
import os
import sys

# `python -m run` puts the current directory first on sys.path: started inside a run dir (data, perhaps from
# elsewhere) a hydra.py or torch.py there would be imported in place of the real one, so there it is dropped first
# (elsewhere it stays: a model.arch=mymodule:Class of one's own may live there)
_CWD = os.getcwd()
if any(
    os.path.lexists(os.path.join(_CWD, name)) for name in ("result.json", "plan.json", ".owner.lock", "checkpoints")
):
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or _CWD) != _CWD]

import hydra
from omegaconf import DictConfig

from speedrun.config import CONF_DIR, register_configs
from speedrun.plan.model_choice import arch_from_argv, register_model_schema
from speedrun.run.resume import register_resolvers
from speedrun.task import task

register_configs()
register_resolvers()
register_model_schema(arch_from_argv(sys.argv))  # a model's own knobs (model.arch=pkg.mod:Cls) compose as typed


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> float:
    return task(cfg)  # speedrun.main(cfg), then the run's objective for Hydra's sweeper (speedrun.task)


if __name__ == "__main__":
    # the command line's own steps, here and not at the top: they serve only `python -m run`, not an import of run
    from speedrun.run.cli_step import print_plan, unknown_override, unwritable, wants_plan

    if "--version" in sys.argv[1:]:  # speedrun's version, not Hydra's alone (Hydra's own flag prints only its)
        from speedrun.cli import version_line

        sys.exit(print(version_line()))
    if "--hydra-help" in sys.argv[1:]:  # Hydra's own page would advertise its shell completion (-sc)
        from speedrun.cli import hydra_help

        sys.exit(print(hydra_help(), end=""))
    if {"-sc", "--shell-completion"} & set(sys.argv[1:]):
        sys.exit(
            "error: shell completion (-sc) is not offered: Hydra's script completes `python <file>.py` command lines "
            "only, not `python -m run` or `speedrun run`; `python -m run --help` lists the config groups and options"
        )
    typo = unknown_override(sys.argv[1:], model_arch=arch_from_argv(sys.argv))  # before Hydra's "+key" advice
    if typo is not None:
        sys.exit(f"error: {typo}")
    if wants_plan(sys.argv):  # `python -m run ... --plan`: print the resolved Plan and exit, writing nothing
        sys.exit(print_plan(sys.argv))
    from speedrun.distributed.launch import worker_argv

    problem = unwritable(sys.argv)  # before Hydra makes the run dir, which it reports as a traceback
    if problem is not None:
        sys.exit(f"error: {problem}")

    sys.argv = worker_argv(sys.argv)  # a rank > 0 under torchrun: no run dir of its own (speedrun.distributed.launch)
    main()
