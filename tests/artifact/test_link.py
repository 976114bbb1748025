"""speedrun.artifact.link on a toy package: what the linker keeps for a Plan, what it refuses, and that the one
readable module and the counted file made from it both run and print the same."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from speedrun.artifact.link import LinkError, chosen_keys, counted, link, readable, settings_source
from speedrun.artifact.wrap import pack

CORE_INIT = (Path(__file__).resolve().parents[2] / "src" / "speedrun" / "core" / "__init__.py").read_text()

MODEL = '''"""A toy core module."""

from __future__ import annotations

import math
from dataclasses import dataclass

from speedrun.core import choice, shell_only
from speedrun.progress import Report


# the square root keeps this comment in the readable file
def used(x: float) -> float:
    # and this one, inside the body
    return math.sqrt(x) + square_root_offset(x)


def square_root_offset(x: float) -> float:
    return x * 2


def dead(x: float) -> float:
    return x


def fast(x: float) -> float:
    return x + 1


def slow(x: float) -> float:
    return x - 1


OPS = choice("op", {"fast": fast, "slow": slow})


@shell_only
def capability() -> int:
    return 1


@dataclass(frozen=True)
class Shape:
    n: int

    def twice(self) -> int:
        return 2 * self.n
'''

PROGRESS = """from collections.abc import Callable
from typing import Any

Report = Callable[[str, dict[str, Any]], None]
"""

DRIVER = """from speedrun.core.model import OPS, Shape, used


def main(plan, file):
    shape = Shape(plan["n"])
    print("result", OPS[plan["op"]](used(shape.twice())))
"""

PLAN = {"op": "fast", "n": 8}


def toy(**changes: str) -> dict[str, str]:
    files = {
        "src/speedrun/core/__init__.py": CORE_INIT,
        "src/speedrun/core/model.py": MODEL,
        "src/speedrun/progress.py": PROGRESS,
        "src/speedrun/driver.py": DRIVER,
    }
    files.update({f"src/speedrun/{k.replace('__', '/')}.py": v for k, v in changes.items()})
    return files


def kept_names(files: dict[str, str], plan=PLAN) -> set[str]:
    return {name for _, name in link(files, plan).symbols}


def test_keeps_what_the_driver_reaches_and_the_registry_entry_the_plan_names():
    kept = kept_names(toy())
    assert {"main", "used", "square_root_offset", "fast", "OPS", "Shape", "choice"} <= kept
    assert not {"dead", "slow", "capability", "shell_only"} & kept
    assert "slow" in kept_names(toy(), {"op": "slow", "n": 1}) and "fast" not in kept_names(toy(), {"op": "slow"})


def test_registry_keys_for_strings_tuples_and_switches():
    assert chosen_keys({"a": {"b": "x"}}, "a.b") == {"x"}
    assert chosen_keys({"a": ["x", "y"]}, "a") == {"x", "y"}
    assert chosen_keys({"a": True}, "a") == {"on"} and chosen_keys({"a": 0}, "a") == {"off"}
    assert chosen_keys(None, "a") is None  # no Plan: every entry


def test_the_readable_file_keeps_comments_and_only_the_chosen_entries():
    text = readable(link(toy(), PLAN), PLAN)
    assert "# the square root keeps this comment in the readable file" in text
    assert "# and this one, inside the body" in text
    assert 'OPS = choice("op", {"fast": fast})' in text
    assert "def slow" not in text and "def dead" not in text and "def capability" not in text
    assert "# ---- speedrun/core/model.py ----" in text and text.index("core/__init__.py") < text.index("model.py")
    assert text.count("import math") == 1 and "\nfrom speedrun." not in text
    assert text.rstrip().endswith("main(PLAN, __file__)")


def test_the_readable_file_and_the_counted_one_run_the_same(tmp_path):
    text = readable(link(toy(), PLAN), PLAN)
    human = tmp_path / "train_gpt_human.py"
    human.write_text(text)
    packed = tmp_path / "train_gpt.py"
    packed.write_bytes(pack(counted(text), "lzma"))
    outs = [
        subprocess.run([sys.executable, str(f)], capture_output=True, text=True, cwd=tmp_path) for f in (human, packed)
    ]
    assert [o.returncode for o in outs] == [0, 0], [o.stderr for o in outs]
    assert outs[0].stdout == outs[1].stdout == "result 37.0\n"  # sqrt(16) + 2 * 16 + 1
    assert len(packed.read_bytes()) < len(text.encode())


REFUSED = [
    (
        "driver",
        DRIVER.replace("import OPS,", "import OPS, capability,").replace("    shape", "    capability()\n    shape"),
        "model.py:38: capability is @shell_only",
    ),
    ("core__model", MODEL.replace("return x * 2", "return vars(x)"), "model.py:19: vars() in linked code"),
    ("core__other", "def square_root_offset():\n    return 0\n", "square_root_offset is also defined"),
    (
        "core__model",
        MODEL.replace("    return x * 2", "    from speedrun.core import choice\n    return x * 2"),
        "model.py:19: imports speedrun.core.choice inside a function",
    ),
    (
        "core__model",
        MODEL.replace("import choice, shell_only", "import choice as pick, shell_only"),
        "imports speedrun.core.choice as pick",
    ),
    (
        "core__model",
        MODEL.replace("import math\n", "import math\nfrom speedrun.config import Config\n"),
        "model.py:6: imports speedrun.config.Config, outside the linked modules",
    ),
]


def test_type_checking_imports_are_neither_refused_nor_shipped():
    model = MODEL.replace(
        "from speedrun.progress import Report\n",
        "from typing import TYPE_CHECKING\n\nfrom speedrun.progress import Report\n\nif TYPE_CHECKING:\n"
        "    from speedrun.core.model import Shape as S\n",
    )
    text = readable(link(toy(core__model=model), PLAN), PLAN)
    assert "TYPE_CHECKING:" not in text and "Shape as S" not in text


@pytest.mark.parametrize("part,source,message", REFUSED)
def test_refusals_name_the_file_and_line(part, source, message):
    files = toy(**{part: source})
    if part == "core__other":  # linked only when reached: the driver uses it
        files["src/speedrun/driver.py"] = DRIVER.replace(
            "def main", "from speedrun.core.other import square_root_offset as h\n\n\ndef main"
        )
        files["src/speedrun/driver.py"] = (
            files["src/speedrun/driver.py"]
            .replace(" as h", "")
            .replace("    shape", "    square_root_offset()\n    shape")
        )
    with pytest.raises(LinkError, match=message.replace("(", r"\(").replace(")", r"\)").replace(".", r"\.")):
        link(files, PLAN)


@pytest.fixture(scope="module")
def record_plans():
    from speedrun.artifact.sizes import resolved

    return {o: resolved([o])[1] for o in ("experiment=pgolf_record", "model=pgolf_baseline")}


@pytest.mark.parametrize("overrides", ["experiment=pgolf_record", "model=pgolf_baseline"])
def test_the_driver_links_with_todays_core_into_one_module_that_loads(record_plans, overrides, tmp_path):
    """speedrun.driver with the core it reaches for the record recipes: nothing refused (no reflection, no name in
    two modules, no import the one module cannot hold), TTT's pass only where the Plan has TTT, and the module,
    minified too, loads with PLAN equal to the settings it was made from."""
    import runpy

    from speedrun.artifact.wrap import CodeSource, linked_module

    code = CodeSource.snapshot().for_plan(record_plans[overrides])
    text = linked_module(code).replace('if __name__ == "__main__":', "if False:")
    assert ("def ttt_evaluate" in text) == (overrides == "experiment=pgolf_record")
    # the readable module loads; the minified one too (checked on the smaller recipe: minifying takes seconds)
    sources = [text, counted(text)] if overrides == "model=pgolf_baseline" else [text]
    for i, source in enumerate(sources):
        path = tmp_path / f"linked_{i}.py"
        path.write_text(source)
        loaded = runpy.run_path(str(path), run_name="speedrun_linked_check")
        assert len([v for v in loaded.values() if callable(v)]) > 100  # the core's functions and classes, defined
        if i == 0:  # the same values, field by field (classes of another module; the minified one renames PLAN)
            assert repr(loaded["PLAN"]) == repr(code.settings)


def test_settings_source_builds_the_same_settings_with_only_what_differs_from_defaults(record_plans):
    import speedrun.core.compile as compile_module
    import speedrun.core.model as model_module
    import speedrun.core.optim as optim_module
    import speedrun.core.pipeline as pipeline_module
    import speedrun.core.quant as quant_module
    import speedrun.core.train as train_module
    import speedrun.core.ttt_lora as ttt_module
    import speedrun.driver as driver_module
    from speedrun.artifact.wrap import frozen_settings

    names: dict = {"float": float}
    for m in (compile_module, model_module, optim_module, pipeline_module, quant_module, train_module, ttt_module):
        names.update(vars(m))
    names.update(vars(driver_module))
    settings = frozen_settings(record_plans["experiment=pgolf_record"])
    source = settings_source(settings)
    assert eval(source, names) == settings  # noqa: S307 - our own output, checked to rebuild what it was made from
    options = names["CompileOptions"]
    assert settings_source(options()) == "CompileOptions()"  # defaults are left out
    assert settings_source(options(cuda_graphs=True)) == "CompileOptions(cuda_graphs=True)"
    assert settings_source(options(compile_mode=1)) == "CompileOptions(compile_mode=1)"  # a value of another type
    assert all(len(line) <= 116 for line in source.splitlines())
    assert settings_source(float("inf")) == 'float("inf")' and settings_source((1,)) == "(1,)"
