"""The Optuna sweeper's search space from Hydra's override grammar (hydra_plugins.speedrun_plugins.optuna_sweeper),
in-process: intervals (float, int(...), log), choices (explicit and a,b,c), ranges, fixed values; the grid's queue in
the seed's order, capped to its size; the refusals of bad settings. Whole studies: tests/e2e/test_optuna_sweep.py."""

from __future__ import annotations

import pytest

optuna = pytest.importorskip("optuna", reason="pip install -e '.[optuna]'")

from hydra.core.override_parser.overrides_parser import OverridesParser  # noqa: E402
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution  # noqa: E402

from hydra_plugins.speedrun_plugins.optuna_sweeper import OptunaSweeper, search_space  # noqa: E402
from speedrun.errors import ConfigError  # noqa: E402


def _space(*overrides: str):
    return search_space(OverridesParser.create().parse_overrides(list(overrides)))


def test_each_kind_of_override_becomes_its_distribution():
    space, fixed = _space(
        "optim.matrix_lr=interval(0.01,0.05)",
        "model.n_layer=int(interval(2,8))",
        "optim.embed_lr=tag(log,interval(0.001,1.0))",
        "attn=choice(sdpa,flex)",
        "seed=0,1,2",
        "model.d_model=range(64,256,64)",
        "debug=smoke",
        "budget.max_steps=2",
    )
    assert space["optim.matrix_lr"] == FloatDistribution(0.01, 0.05)
    assert space["model.n_layer"] == IntDistribution(2, 8)
    assert space["optim.embed_lr"] == FloatDistribution(0.001, 1.0, log=True)
    assert space["attn"] == CategoricalDistribution(["sdpa", "flex"])
    assert space["seed"] == CategoricalDistribution([0, 1, 2])
    assert space["model.d_model"] == CategoricalDistribution([64, 128, 192])
    assert fixed == ["debug=smoke", "budget.max_steps=2"]


def test_the_grid_is_queued_in_the_seeds_order_and_caps_n_trials():
    space, _ = _space("a=choice(1,2)", "b=choice(x,y,z)")

    def queued(seed: int, n_trials: int) -> tuple[list[dict], int]:
        sweeper = OptunaSweeper(sampler="grid", seed=seed, n_trials=n_trials)
        study = optuna.create_study()
        sweeper._queue_grid(optuna, study, space)
        return [t.system_attrs["fixed_params"] for t in study.trials], sweeper.n_trials

    first, capped = queued(0, 100)
    assert (
        capped == 6
        and len(first) == 6
        and {tuple(sorted(p.items())) for p in first} == {(("a", a), ("b", b)) for a in (1, 2) for b in "xyz"}
    )
    assert queued(0, 6)[0] == first and queued(1, 6)[0] != first  # the seed, and the seed alone, fixes the order
    with pytest.raises(ConfigError, match=r"sampler=grid needs every parameter as a choice: c is an interval"):
        OptunaSweeper(sampler="grid")._queue_grid(optuna, optuna.create_study(), _space("c=interval(0,1)")[0])


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"direction": "up"}, "hydra.sweeper.direction=up must be minimize or maximize"),
        ({"n_trials": 0}, "hydra.sweeper.n_trials=0 must be >= 1"),
        ({"sampler": "cmaes"}, "hydra.sweeper.sampler=cmaes is not one of tpe, random, grid"),
        ({"pruner": "hyperband"}, "hydra.sweeper.pruner=hyperband is not one of median, none"),
    ],
)
def test_bad_settings_are_refused_in_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        OptunaSweeper(**kwargs)._check()


class _Launcher:
    """Stands in for the pool: each batch's jobs end ok with val_bpb = the learning rate, except those past
    ``run_first`` when ``interrupted`` (Ctrl-C: the pool starts no more)."""

    def __init__(self, interrupted: bool, run_first: int = 1):
        self.interrupted, self.run_first, self.batches = interrupted, run_first, []

    def launch(self, batch, initial_job_idx):
        from hydra.core.utils import JobReturn, JobStatus

        from hydra_plugins.speedrun_plugins.job_pool import JobNotRun
        from speedrun.records.objective import Objective

        self.batches.append(batch)
        out = []
        for i, overrides in enumerate(batch):
            ret = JobReturn()
            if self.interrupted and i >= self.run_first:
                ret.status, ret._return_value = JobStatus.FAILED, JobNotRun("not run: interrupted")
            else:
                (lr,) = (float(o.split("=")[1]) for o in overrides if o.startswith("lr="))
                ret.status, ret._return_value = JobStatus.COMPLETED, Objective(lr, {"status": "ok"})
            out.append(ret)
        return out


def test_an_interrupted_pool_leaves_its_unrun_trials_queued_for_the_same_command(tmp_path):
    from types import SimpleNamespace

    from omegaconf import OmegaConf

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "s1")}}, "name": "t", "objective": "val_bpb"})
    storage = f"sqlite:///{tmp_path / 'study.db'}"

    def sweeper(launcher, sweep_dir):
        s = OptunaSweeper(n_trials=3, n_jobs=2, storage=storage, pruner="none")
        s.config = OmegaConf.merge(config, {"hydra": {"sweep": {"dir": str(tmp_path / sweep_dir)}}})
        s.launcher, s.hydra_context = launcher, SimpleNamespace(config_loader=None)
        return s

    first = _Launcher(interrupted=True)
    sweeper(first, "s1").sweep(["lr=interval(0.01,0.05)"])
    assert len(first.batches) == 1  # stopped after the interrupted batch
    trials = optuna.load_study(study_name="t", storage=storage).trials
    assert [t.state.name for t in trials] == ["COMPLETE", "FAIL", "WAITING"]
    assert trials[2].params == {} and trials[2].system_attrs["fixed_params"] == trials[1].params

    second = _Launcher(interrupted=False)
    sweeper(second, "s2").sweep(["lr=interval(0.01,0.05)"])
    trials = optuna.load_study(study_name="t", storage=storage).trials
    done = [t for t in trials if t.state.name == "COMPLETE"]
    assert len(done) == 3 and done[1].params == trials[1].params  # the unrun trial ran first, with its values
    assert [o for o in second.batches[0][0] if o.startswith("lr=")] == [f"lr={trials[1].params['lr']}"]
