"""The counted code bytes of a config, measured without training (speedrun.artifact.sizes): the file a run would
write carries only the core its Plan reaches, so a leaner recipe counts fewer bytes, and the record recipes fit
their targets."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from speedrun.artifact.link import counted
from speedrun.artifact.sizes import RECORD, RECORD_LINES, ROLES, TARGETS, code_size, role_costs, role_of, role_table
from speedrun.artifact.wrap import pack


@pytest.fixture(scope="module")
def sizes():
    return {overrides: code_size([overrides]) for overrides in TARGETS}


def test_a_file_counts_only_what_its_plan_reaches(sizes):
    record, baseline = sizes["experiment=pgolf_record"], sizes["model=pgolf_baseline"]
    assert baseline.code_bytes < record.code_bytes
    # the record's TTT is linked, the baseline's file has none of it; neither carries the shell
    ttt = ("speedrun/core/ttt_score.py", "speedrun/core/ttt_global.py", "speedrun/core/ttt_lora.py")
    assert sum(record.modules[p] for p in ttt) > 5_000  # the score-first pass, its global phases, the adapters
    assert sum(baseline.modules.get(p, 0) for p in ttt) < 500  # an empty registry, a settings type at most
    assert all(
        p.startswith(
            ("speedrun/core/", "speedrun/driver.py", "speedrun/progress.py", "speedrun/tables.py", "speedrun/errors.py")
        )
        for p in record.modules
    )
    assert all(n > 0 for n in record.modules.values())


@pytest.mark.parametrize("overrides", sorted(TARGETS))
def test_the_code_fits_its_target(sizes, overrides):
    assert sizes[overrides].code_bytes <= TARGETS[overrides]


def test_each_linked_module_has_its_role():
    roles = {
        "speedrun/core/attention.py": "model",
        "speedrun/core/optim.py": "model",
        "src/speedrun/core/data.py": "data",
        "speedrun/core/train.py": "step",
        "speedrun/core/dist.py": "step",
        "speedrun/core/pipeline.py": "step",
        "speedrun/core/evaluate.py": "eval",
        "speedrun/core/pergroup.py": "quant",
        "speedrun/core/ttt_lora.py": "TTT",
        "speedrun/core/ttt_score.py": "TTT",
        "speedrun/driver.py": "driver",
        "speedrun/core/__init__.py": "driver",
        "speedrun/progress.py": "driver",
    }
    assert {path: role_of(path) for path in roles} == roles
    assert set(roles.values()) == set(ROLES) == set(RECORD) == set(RECORD_LINES)


def test_each_role_costs_what_it_weighs_alone_and_what_the_file_loses_without_it():
    files = {
        "src/speedrun/__init__.py": "X = 1\n",
        "src/speedrun/core/model.py": "".join(f"def f{i}(x):\n    return x * {i} + {i * i}\n" for i in range(300)),
        "src/speedrun/core/ttt_b.py": "Y = 2\n",
    }
    full, empty, roles = role_costs(files, lambda parts: pack(counted("\n".join(parts.values()))))
    assert full == len(pack(counted("\n".join(files.values())))) and list(roles) == ["driver", "model", "TTT"]
    assert all(cost.files == 1 for cost in roles.values())
    assert roles["model"].alone > 10 * max(roles["TTT"].alone, 1) and roles["model"].lose > 10 * roles["TTT"].lose
    assert roles["model"].lose <= roles["model"].alone <= full - empty
    table = role_table(full, empty, roles, 40_000)
    assert f"{full:,} (target 40,000)" in table and f"{RECORD['TTT'].alone:,}" in table


def test_the_record_lines_cut_its_script_into_roles_once():
    """RECORD_LINES: every line of the record's 3,575 in exactly one role."""
    lines = sorted(n for spans in RECORD_LINES.values() for a, b in spans for n in range(a, b + 1))
    assert lines == list(range(1, 3576))


DOCS_TOLERANCE = 0.05
"""How far docs/export.md's table may drift from what the code counts now before it is stale: code changes every
day by a few hundred bytes, and regenerating the table each time would churn the page; a package's worth (5%) is
the point at which a reader is misled."""


def test_docs_export_md_table_is_not_stale(sizes):
    page = (Path(__file__).resolve().parents[2] / "docs" / "export.md").read_text()
    documented = {m[0]: int(m[1].replace(",", "")) for m in re.findall(r"^\| `([^`]+)` \| ([\d,]+) \|", page, re.M)}
    for overrides, size in sizes.items():
        assert overrides in documented, f"docs/export.md has no row for {overrides}"
        drift = abs(documented[overrides] - size.code_bytes) / size.code_bytes
        assert drift <= DOCS_TOLERANCE, (
            f"docs/export.md says {documented[overrides]:,} code bytes for {overrides}, the code counts "
            f"{size.code_bytes:,} ({drift:.0%} off): python -m speedrun.artifact.sizes --write docs/export.md"
        )
