"""What a run's train_gpt.py carries (speedrun.artifact.closure): the import closure of its re-run, computed from the
source and the run's Plan. The walk's rules on a package of its own; every import of a Plan-selected module sits
inside a function; the closures of real configs hold their choices and none of the tools. That an exported file's
re-run imports nothing it lacks: tests/export/test_lean_rerun.py."""

from __future__ import annotations

import types

import pytest

from speedrun.artifact import closure
from speedrun.artifact.closure import SELECTED, imports_of, reached, selected_key

TOOLS = (
    "speedrun/report/",
    "speedrun/export/",
    "speedrun/bench/",
    "speedrun/tune.py",
    "speedrun/stats.py",
    "speedrun/artifact/sizes.py",
    "speedrun/artifact/wrap.py",
    "speedrun/artifact/minify.py",
    "speedrun/run/cli_step.py",
    "speedrun/data/prepare.py",
    "speedrun/data/python_corpus.py",
    "hydra_plugins/",
    "run.py",
)
"""What no re-run imports: the report, sweeps, export, tuner, bench, the command line's own steps, the file maker and
the dataset builder (a re-run names its data)."""


def _package(root, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def test_the_walk_follows_every_import_but_type_checking_and_an_unchosen_module(tmp_path, monkeypatch):
    """Top-level and function-level imports are followed (a package's __init__ with its module), TYPE_CHECKING
    imports are not, and a SELECTED module is packed, and walked from, only when the Plan's test holds."""
    _package(
        tmp_path,
        {
            "speedrun/__init__.py": "",
            "speedrun/rerun.py": "import speedrun.top\ndef f():\n    from speedrun.pkg import inner\n",
            "speedrun/top.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import speedrun.typing_only\n"
            "else:\n    import speedrun.runtime\ndef g():\n    import speedrun.chosen\n",
            "speedrun/pkg/__init__.py": "",
            "speedrun/pkg/inner.py": "X = 1\n",
            "speedrun/typing_only.py": "",
            "speedrun/runtime.py": "",
            "speedrun/chosen.py": "import speedrun.behind_chosen\n",
            "speedrun/behind_chosen.py": "",
            "speedrun/core/__init__.py": "",
            "speedrun/core/model.py": "",
        },
    )
    monkeypatch.setattr(closure, "SRC", tmp_path)
    monkeypatch.setattr(closure, "SELECTED", {"speedrun.chosen": lambda plan: plan.on})
    always = {
        "speedrun/__init__.py",
        "speedrun/rerun.py",
        "speedrun/top.py",
        "speedrun/runtime.py",
        "speedrun/pkg/__init__.py",
        "speedrun/pkg/inner.py",
        "speedrun/core/__init__.py",
        "speedrun/core/model.py",  # the model class, imported by its name
    }
    plan = types.SimpleNamespace(on=False, model_arch="gpt")
    assert set(reached(plan)) == always
    plan.on = True
    assert set(reached(plan)) == always | {"speedrun/chosen.py", "speedrun/behind_chosen.py"}
    assert set(reached(None)) == set(reached(plan))  # no Plan: every choice


def test_every_import_of_a_selected_module_sits_inside_a_function():
    """A module imported at another's top is imported whatever the Plan says, so its SELECTED test would leave out
    a module the re-run needs. Only modules selected by the same choice (a package's modules, TTT's and the finish's
    TTT phase) may import each other at their top."""
    everything = closure.closure([closure.ENTRY, *SELECTED], lambda key: True)
    wrong = [
        f"{module} imports {name} at its top"
        for module in sorted(everything)
        for name, top in imports_of(module).items()
        if top and selected_key(name) is not None and not _same_choice(module, name)
    ]
    assert not wrong, wrong


def _same_choice(module: str, name: str) -> bool:
    mine = selected_key(module)
    return mine is not None and SELECTED[mine] is SELECTED[selected_key(name) or ""]


@pytest.fixture(scope="module")
def plans():
    """Resolved Plans of a few configs (composed as `python -m run` composes them; pgolf_record for an H100)."""
    from speedrun.artifact.sizes import resolved

    return {
        "smoke": resolved(["debug=smoke"], card="cpu")[1],
        "record": resolved(["experiment=pgolf_record"])[1],
        "flex": resolved(["attn=flex", "quant=off"])[1],
    }


def test_a_closure_holds_the_runs_choices_and_none_of_the_tools(plans):
    record, smoke, flex = (set(reached(plans[k])) for k in ("record", "smoke", "flex"))
    ttt = {"speedrun/core/ttt_score.py", "speedrun/core/ttt_global.py", "speedrun/run/finish_ttt.py"}
    assert ttt <= record and "speedrun/core/attention.py" in record  # the backends: one module, linked by name
    # the smoke run: TTT off, sdpa on CPU; flex's tile tables only under attn=flex
    assert not {p for p in smoke if p.startswith("speedrun/core/ttt_")} and "speedrun/run/finish_ttt.py" not in smoke
    assert "speedrun/kernels/tiles.py" in flex and "speedrun/kernels/tiles.py" not in smoke | record
    for packed in (record, smoke, flex):
        assert not [p for p in packed if p.startswith(TOOLS)], [p for p in packed if p.startswith(TOOLS)]
        assert "speedrun/rerun.py" in packed and "speedrun/artifact/unwrap.py" in packed
