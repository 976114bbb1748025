"""The docs stay true to the code: every relative link in README.md and docs/*.md resolves (the file, and a
``#anchor`` to a heading by GitHub's slug rules), links point at pages and images rather than source files (which
move), every ``python -m run`` command in a code block composes with the real conf/ tree and passes the schemas'
own checks, every ``python -m speedrun.report`` command parses (``speedrun run`` and ``speedrun report``, the
console command's, as well), and the README keeps the test command that
.ci/run runs. In-process (Hydra's compose API), so the whole file takes seconds."""

from __future__ import annotations

import functools
import re
import shlex
import unicodedata
from dataclasses import dataclass
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
DOCS = REPO / "docs"
PAGES = [README, *sorted(DOCS.glob("*.md"))]
README_MAX_LINES = 220

TEST_COMMAND = "pip install -e '.[dev]' && pytest"
"""The README's test command: .ci/run runs it as written there, so the two must not drift apart."""

LINKABLE = {".md", ".png", ".jpg", ".jpeg", ".gif", ".svg"}
"""What a relative link may point at: pages and images. Source files are named in backticks instead, since modules
move between packages and a link to one would break silently on GitHub."""

SKIP_COMPOSE: dict[str, str] = {
    # "<page>:<line>": "why this documented command cannot compose here"
    # (placeholders such as <run dir> are filled in below)
    "README.md:56": "experiment=mine is the reader's own option, in the --config-dir folder the line above makes",
}

RUN_FLAGS = {"-m", "--multirun", "--plan", "--plan=json", "--resolve"}
"""Flags of `python -m run` that take no value and do not change what is composed (-m: the sweep is expanded
below; --plan, --plan=json: resolve after composing)."""
RUN_FLAGS_WITH_VALUE = {"--cfg", "-c", "--package", "-p", "--config-dir", "-cd"}


def rel(path: Path) -> str:
    return str(path.relative_to(REPO))


# ---------------------------------------------------------------------------------------------------- Markdown


def split_markdown(text: str) -> tuple[list[tuple[int, str]], list[tuple[int, str]]]:
    """(prose lines, code lines), each as (1-based line number, line). Code is fenced (``` or ~~~) or indented by
    four spaces after a blank line (CommonMark's indented block, ignoring list nesting, which these pages avoid)."""
    prose: list[tuple[int, str]] = []
    code: list[tuple[int, str]] = []
    fence: str | None = None
    indented = False
    previous_blank = True
    for n, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if fence is not None:
            if stripped.startswith(fence):
                fence = None
            else:
                code.append((n, line))
            previous_blank = False
            continue
        match = re.match(r"\s{0,3}(```+|~~~+)", line)
        if match:
            fence = match.group(1)
            indented = False
            continue
        if line.startswith("    ") and stripped and (previous_blank or indented):
            indented = True
            code.append((n, line[4:]))
        else:
            if stripped:
                indented = False
            prose.append((n, line))
        previous_blank = not stripped
    return prose, code


def without_code_spans(line: str) -> str:
    return re.sub(r"(`+).*?\1", "", line)


def github_slug(heading: str) -> str:
    """GitHub's anchor for a heading (github-slugger): the rendered text, lower-cased, with everything but letters,
    marks, numbers, connector punctuation, spaces and hyphens removed, and each space turned into a hyphen."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link renders as its text
    text = text.replace("`", "").strip().lower()
    kept = [ch for ch in text if ch in " -" or unicodedata.category(ch)[0] in "LMN" or unicodedata.category(ch) == "Pc"]
    return "".join(kept).replace(" ", "-")


def anchors(page: Path) -> set[str]:
    prose, _ = split_markdown(page.read_text())
    seen: dict[str, int] = {}
    out = set()
    for _, line in prose:
        match = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not match:
            continue
        slug = github_slug(match.group(1))
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        out.add(slug if count == 0 else f"{slug}-{count}")
    for _, line in prose:  # explicit anchors: <a id="..."> / <a name="...">
        out.update(re.findall(r"<a\s+(?:id|name)=\"([^\"]+)\"", line))
    return out


@dataclass(frozen=True)
class Link:
    page: Path
    line: int
    target: str

    def __str__(self) -> str:
        return f"{rel(self.page)}:{self.line}: ({self.target})"


def links(page: Path) -> list[Link]:
    prose, _ = split_markdown(page.read_text())
    out = []
    for n, line in prose:
        line = without_code_spans(line)
        targets = re.findall(r"\]\(\s*<?([^)\s>]*)>?(?:\s+\"[^\"]*\")?\s*\)", line)
        targets += re.findall(r"^\s{0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s|$)", line)  # reference definitions
        out += [Link(page, n, t) for t in targets]
    return out


def is_external(target: str) -> bool:
    return bool(re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith("//")


ALL_LINKS = [link for page in PAGES for link in links(page) if not is_external(link.target)]


def test_the_pages_exist_and_link_somewhere():
    assert README.exists() and len(PAGES) > 5
    assert ALL_LINKS, "no relative links found: the link parser is broken"


@pytest.mark.parametrize("link", ALL_LINKS, ids=str)
def test_every_relative_link_resolves(link):
    path, _, anchor = link.target.partition("#")
    target = (link.page.parent / path).resolve() if path else link.page
    assert target.exists(), f"{link}: {rel(target) if target.is_relative_to(REPO) else target} does not exist"
    assert target.is_dir() or target.suffix.lower() in LINKABLE, (
        f"{link}: link pages and images only; name source files in backticks (modules move)"
    )
    if anchor:
        assert target.suffix == ".md", f"{link}: an anchor into a non-Markdown file"
        found = anchors(target)
        assert anchor in found, f"{link}: no heading with anchor #{anchor} in {rel(target)}; anchors: {sorted(found)}"


def test_the_slug_rules():
    assert github_slug("Kernel settings (`kernel`)") == "kernel-settings-kernel"
    assert github_slug("Weights & Biases") == "weights--biases"
    assert github_slug("`hardware.micro_batch=auto`") == "hardwaremicro_batchauto"
    assert github_slug("Real FineWeb shards (parameter-golf's)") == "real-fineweb-shards-parameter-golfs"
    assert github_slug("Measured 2026-11-26, second run (4 x H100)") == "measured-2026-11-26-second-run-4-x-h100"


def test_every_docs_page_is_in_the_readme_index():
    linked = {(README.parent / link.target.partition("#")[0]).resolve() for link in links(README)}
    missing = [rel(p) for p in sorted(DOCS.glob("*.md")) if p.resolve() not in linked]
    assert not missing, f"docs pages the README does not link: {missing}"


def test_the_readme_is_short_and_keeps_the_ci_test_command():
    lines = README.read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; move detail to docs/"
    _, code = split_markdown(README.read_text())
    commands = [line.split("#")[0].strip() for _, line in code]
    assert TEST_COMMAND in commands, f"README's code blocks lost the test command {TEST_COMMAND!r}"
    ci = (REPO / ".ci" / "run").read_text()
    assert TEST_COMMAND in ci.splitlines(), f".ci/run no longer runs the README's test command {TEST_COMMAND!r}"


# ---------------------------------------------------------------------------------------------------- commands


@dataclass(frozen=True)
class Command:
    page: Path
    line: int
    text: str
    tool: str  # "run" or "report"
    args: tuple[str, ...]

    @property
    def where(self) -> str:
        return f"{rel(self.page)}:{self.line}"

    def __str__(self) -> str:
        return f"{self.where}: {self.text}"


def logical_lines(code: list[tuple[int, str]]) -> list[tuple[int, str]]:
    """Code lines with backslash continuations joined, each with the number of its first line."""
    out: list[tuple[int, str]] = []
    pending: tuple[int, str] | None = None
    for n, line in code:
        if pending is not None:
            n, line = pending[0], pending[1] + " " + line.strip()
            pending = None
        if line.rstrip().endswith("\\"):
            pending = (n, line.rstrip()[:-1])
        else:
            out.append((n, line))
    if pending is not None:
        out.append(pending)
    return out


def invocations(tokens: list[str]) -> list[tuple[str, list[str]]]:
    """Each `python -m run ...` / `python -m speedrun.report ...` (or `speedrun run ...` / `speedrun report ...`,
    the console command) in a shell line's tokens: (tool, arguments). Leading VAR=value assignments and a
    `torchrun [options] -m run` wrapper are stripped."""
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token in ("&&", "||", ";", "|"):
            segments.append([])
        else:
            segments[-1].append(token)
    found = []
    for seg in segments:
        while seg and re.match(r"[A-Za-z_][A-Za-z0-9_]*=", seg[0]):
            seg = seg[1:]
        if len(seg) > 1 and seg[0] == "speedrun" and seg[1] in ("run", "report"):
            found.append((seg[1], seg[2:]))
            continue
        if not seg or seg[0] not in ("python", "python3", "torchrun"):
            continue
        for i in range(1, len(seg) - 1):
            if seg[i] == "-m":
                if seg[i + 1] == "run":
                    found.append(("run", seg[i + 2 :]))
                elif seg[i + 1] == "speedrun.report":
                    found.append(("report", seg[i + 2 :]))
                break
    return found


def commands() -> list[Command]:
    out = []
    for page in PAGES:
        _, code = split_markdown(page.read_text())
        for n, line in logical_lines(code):
            if not any(tool in line for tool in ("-m run", "-m speedrun.report", "speedrun run", "speedrun report")):
                continue
            try:
                tokens = shlex.split(line, comments=True)
            except ValueError as e:  # unbalanced quotes: a broken command in the docs
                tokens = ["python", "-m", "run", f"<shlex: {e}>"]
            out += [Command(page, n, line.split(" #")[0].strip(), tool, tuple(a)) for tool, a in invocations(tokens)]
    return out


COMMANDS = commands()
RUN_COMMANDS = [c for c in COMMANDS if c.tool == "run"]
REPORT_COMMANDS = [c for c in COMMANDS if c.tool == "report"]


def fill_placeholders(arg: str) -> str:
    """`<run dir>`, `<parameter-golf>`, `<partition>`: the reader fills these in; any word composes the same."""
    return re.sub(r"<[^<>]+>", "placeholder", arg)


def overrides_of(command: Command) -> tuple[list[str], bool]:
    """The Hydra overrides of a `python -m run` command line, and whether it is a multirun (-m)."""
    overrides, multirun = [], False
    args = list(command.args)
    while args:
        arg = args.pop(0)
        if arg in ("-m", "--multirun"):
            multirun = True
        elif arg in RUN_FLAGS:
            pass
        elif arg in RUN_FLAGS_WITH_VALUE:
            args.pop(0)
        elif arg.startswith("-"):
            raise AssertionError(f"{command}: unknown flag {arg!r} for python -m run")
        else:
            overrides.append(fill_placeholders(arg))
    return overrides, multirun


def compositions(command: Command) -> list[list[str]]:
    """The override lists to compose: one for a single run; for a sweep, as many as its longest axis has values,
    the i-th taking each axis's i-th value (its last, once shorter), so every value of every axis composes."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    overrides, multirun = overrides_of(command)
    parsed = OverridesParser.create().parse_overrides(overrides)
    sweeps = {i: _sweep_values(o) for i, o in enumerate(parsed) if o.is_sweep_override()}
    if sweeps and not multirun:
        raise AssertionError(f"{command}: comma lists sweep only with -m (Hydra refuses this line without it)")
    if not sweeps:
        return [overrides]
    width = max(len(v) for v in sweeps.values())
    return [
        [
            f"{o.get_key_element()}={sweeps[i][min(k, len(sweeps[i]) - 1)]}" if i in sweeps else overrides[i]
            for i, o in enumerate(parsed)
        ]
        for k in range(width)
    ]


def _sweep_values(override) -> list[str]:
    """A sweep axis's values; an adaptive sweeper's interval(a,b), which Hydra cannot enumerate, as its two ends."""
    from hydra.core.override_parser.types import IntervalSweep

    value = override.value()
    if isinstance(value, IntervalSweep):
        return [str(value.start), str(value.end)]
    return list(override.sweep_string_iterator())


@pytest.fixture(scope="module")
def compose_job():
    from hydra import compose, initialize_config_dir
    from omegaconf import OmegaConf

    from speedrun.config import CONF_DIR, register_configs, to_config

    register_configs()

    @functools.cache  # pages repeat commands (and sweeps repeat combinations): compose each once, ~0.3 s each
    def _compose(overrides: tuple[str, ...]):
        with initialize_config_dir(config_dir=str(CONF_DIR), version_base="1.3"):
            cfg = compose("config", overrides=list(overrides), return_hydra_config=True)  # hydra.* checked too
        job = OmegaConf.masked_copy(cfg, [k for k in cfg if k != "hydra"])
        OmegaConf.to_container(job, resolve=True)  # every interpolation resolves
        return to_config(job)  # the schemas' own checks (ConfigError), as a run makes them before resolving

    return lambda overrides: _compose(tuple(overrides))


def test_the_docs_have_commands_to_check():
    assert len(RUN_COMMANDS) >= 20 and REPORT_COMMANDS, (len(RUN_COMMANDS), len(REPORT_COMMANDS))
    stale = set(SKIP_COMPOSE) - {c.where for c in RUN_COMMANDS}
    assert not stale, f"SKIP_COMPOSE names commands the docs no longer have: {sorted(stale)}"


@pytest.mark.parametrize("command", RUN_COMMANDS, ids=str)
def test_every_documented_run_command_composes(command, compose_job):
    if command.where in SKIP_COMPOSE:
        pytest.skip(SKIP_COMPOSE[command.where])
    for overrides in compositions(command):
        try:
            compose_job(overrides)
        except Exception as e:  # noqa: BLE001 - the message names the command and Hydra's or the schema's error
            pytest.fail(f"{command}\n  composed as: {' '.join(overrides)}\n  {type(e).__name__}: {e}")


@pytest.mark.parametrize("command", REPORT_COMMANDS, ids=str)
def test_every_documented_report_command_parses(command):
    from speedrun.report.cli import build_parser

    try:
        build_parser().parse_args([fill_placeholders(a) for a in command.args])
    except SystemExit:
        pytest.fail(f"{command}: python -m speedrun.report does not accept these arguments")


def test_a_bad_documented_command_would_fail(compose_job):
    """The checks above can fail: a misspelt key, a sweep without -m, an unknown option."""
    bad = Command(README, 0, "", "run", ("budget.train_secnds=5",))
    with pytest.raises(Exception, match="train_secnds"):
        compose_job(compositions(bad)[0])
    with pytest.raises(AssertionError, match="only with -m"):
        compositions(Command(README, 0, "", "run", ("seed=0,1",)))
    sweep = compositions(Command(README, 0, "", "run", ("-m", "attn=sdpa,flex,math", "seed=0,1", "--plan")))
    assert sweep == [["attn=sdpa", "seed=0"], ["attn=flex", "seed=1"], ["attn=math", "seed=1"]]
    assert invocations(shlex.split("A=1 torchrun --standalone --nproc_per_node=8 -m run x=1 # c", comments=True)) == [
        ("run", ["x=1"])
    ]
