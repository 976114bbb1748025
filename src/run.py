"""`python -m run [group=option ...]`: compose the config with Hydra and hand it to speedrun. Nothing else."""

import sys

import hydra
from omegaconf import DictConfig

from speedrun.config import CONF_DIR, register_configs
from speedrun.model.registry import arch_from_argv, register_model_schema
from speedrun.task import task
from speedrun.training.resume import register_resolvers

register_configs()
register_resolvers()
register_model_schema(arch_from_argv(sys.argv))  # a model's own knobs (model.arch=pkg.mod:Cls) compose as typed


@hydra.main(version_base="1.3", config_path=str(CONF_DIR), config_name="config")
def main(cfg: DictConfig) -> float:
    return task(cfg)  # speedrun.main(cfg), then the run's objective for Hydra's sweeper (speedrun.task)


if __name__ == "__main__":
    # the command line's own steps, here and not at the top: they serve only `python -m run`, not an import of run
    from speedrun.config.did_you_mean import unknown_override
    from speedrun.run.plan_only import print_plan, wants_plan

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
    from speedrun.run.preflight import unwritable

    problem = unwritable(sys.argv)  # before Hydra makes the run dir, which it reports as a traceback
    if problem is not None:
        sys.exit(f"error: {problem}")

    sys.argv = worker_argv(sys.argv)  # a rank > 0 under torchrun: no run dir of its own (speedrun.distributed.launch)
    main()
