"""The files of a submission folder, as parameter-golf's records lay them out: train_gpt.py (the self-extracting
file, whose bytes are counted), train_gpt_human.py (the same code to read), README.md (numbers, settings, card, command), submission.json (the fields the records carry), one log per
seed and requirements.txt (what parameter-golf's image lacks).
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import time
from dataclasses import dataclass
from typing import Any

from speedrun.artifact.code_count import HUMAN_FILE, MANIFEST, WRAPPED_FILE
from speedrun.artifact.wrap import OPTIONAL, compressor_of, requirements
from speedrun.config.track_rules import levers_used, load_track
from speedrun.export.run_dirs import ExportError, Run
from speedrun.export.track import RECORD_NAME, claim, limits_table, record_evidence
from speedrun.report.accept import Judged, Reference, judge_results
from speedrun.stats import mean, std
from speedrun.tables import format_table, mean_std_cell

HEADLINES = (("val_bpb_ttt", "val_loss_ttt"), ("val_bpb_quant", "val_loss_quant"), ("val_bpb", "val_loss"))
"""The number a submission reports, best first: what the artifact earns after test-time training (when it scored
every token), else the dequantized artifact's, else the trained model's."""

PGOLF_IMAGE = ("torch", "numpy", "sentencepiece")
"""What parameter-golf's requirements.txt installs already, of what a re-run imports (speedrun.artifact.wrap.REQUIRED):
requirements.txt lists the rest (a compressor's package, tiktoken, OmegaConf under kernel=tuned), pinned to the
run's version where its env.json records one."""


def headline(result: dict[str, Any]) -> tuple[str, str]:
    """(bpb key, loss key) of the number this run's submission reports (HEADLINES)."""
    for bpb, loss in HEADLINES:
        if result.get(bpb) is not None and (bpb != "val_bpb_ttt" or result.get("ttt_complete")):
            return bpb, loss
    raise ExportError(f"{result.get('run_dir')}: no val_bpb recorded; export a finished run")


@dataclass
class Submission:
    runs: list[Run]
    code: bytes
    """The train_gpt.py shipped (the first run's)."""
    name: str
    author: str = ""
    github_id: str = ""
    track: str = RECORD_NAME
    """The track asked for (conf/track/); the record track is claimed only when the runs may claim it."""
    summary: str = ""
    blurb: str = ""
    """submission.json's short description; default_blurb() when empty."""
    record: Reference | None = None
    """The standing record the acceptance test compares with (--record); None: the best merged one of the data."""
    human: str | None = None
    """train_gpt_human.py: the code of ``code`` to read (None: the run wrote none, so the folder ships none)."""

    def __post_init__(self) -> None:
        self.bpb_key, self.loss_key = headline(self.runs[0].result)
        self.date, self.date_source = run_date(self.runs)
        self.acceptance: Judged = judge_results(load_track(RECORD_NAME), [r.result for r in self.runs], self.record)

    # -- numbers ------------------------------------------------------------------------------------------------
    def values(self, key: str) -> list[float]:
        return [float(r.result[key]) for r in self.runs if r.result.get(key) is not None]

    def total(self, run: Run) -> int:
        """The run's model bytes plus the shipped file's: the artifact as submitted."""
        return int(run.result.get("artifact_model_bytes") or 0) + len(self.code)

    def cap(self) -> int:
        return int(self.runs[0].config.get("quant", {}).get("cap_bytes", 16_000_000))

    def seed_results(self) -> dict[str, dict[str, Any]]:
        out = {}
        for run in self.runs:
            r = run.result
            out[str(run.seed)] = {
                "val_bpb": r.get(self.bpb_key),
                "val_loss": r.get(self.loss_key),
                "val_bpb_prequant": r.get("val_bpb"),
                "artifact_bytes": self.total(run),
                "bytes_model": r.get("artifact_model_bytes"),
                "steps": r.get("steps"),
                "train_time_s": r.get("train_seconds"),
                "eval_time_s": r.get("eval_seconds"),
                "tokens_per_s": r.get("tokens_per_s"),
            }
        return out

    def labelled(self) -> list[tuple[str, dict[str, Any], int]]:
        """(label, result, artifact bytes as submitted) of every run."""
        return [(f"seed {run.seed}", run.result, self.total(run)) for run in self.runs]

    def track_claim(self) -> dict[str, Any]:
        """track, record_track and track_reason (speedrun.export.track.claim), the runs' evidence judged."""
        evidence = record_evidence(self.runs, self.acceptance) if self.track == RECORD_NAME else []
        return claim(self.labelled(), self.track, unverified=bool(self.code_problems()), evidence=evidence)

    def significance(self) -> dict[str, Any]:
        """The records' comparison fields: the record tested against, the delta in nats and bpb, t and p, how."""
        j = self.acceptance
        ref = j.reference
        return {
            "comparison_record": None
            if ref is None
            else {
                "name": ref.label,
                "val_loss": ref.val_loss,
                "val_bpb": ref.val_bpb,
                "val_loss_std": ref.std,
                "n": ref.n,
                "source": ref.source,
            },
            "scored_loss": j.loss_key,
            "delta_vs_record_nats": _round(j.diff),
            "delta_vs_record_bpb": _round(j.diff_bpb),
            "t_statistic": None if j.test is None else _round(j.test.t),
            "p_value": None if j.test is None else j.test.p,
            "significance_test": (
                f"one-sided one-sample t-test over {len(j.values)} seeds of H1 mean {j.loss_key} < the record's "
                f"published mean - {load_track(RECORD_NAME).acceptance.margin:g} nats"
                if j.test is not None
                else f"not tested: {j.untested or 'fewer than 2 seeds'}"
            ),
        }

    def compliance(self) -> dict[str, Any]:
        """The records' compliance block: each rule of the record track, measured on every seed."""
        record = load_track(RECORD_NAME)
        results = [r.result for r in self.runs]
        train = [r.get("train_seconds") for r in results]
        evals = [r.get("eval_seconds") for r in results]
        sizes = [self.total(run) for run in self.runs]
        ttt = any(r.get("val_bpb_ttt") is not None for r in results)

        def within(xs: list[Any], limit: float | None) -> bool:
            return limit is not None and all(x is not None and float(x) <= limit for x in xs)

        return {
            "train_under_600s": within(train, record.train_seconds),
            "eval_under_600s": within(evals, record.eval_seconds),
            "artifact_under_16mb": within(sizes, record.artifact_cap_bytes),
            "full_validation": all(r.get("eval_whole_split") is True for r in results),
            "score_first_ttt": True if ttt else None,  # speedrun's TTT scores each chunk before it learns from it
            "three_seeds": len(self.runs) >= (record.acceptance.min_seeds or 3),
            "track_rules_every_seed": all(r.get("track") == RECORD_NAME and r.get("track_ok") for r in results),
            "train_time_max_s": max((float(x) for x in train if x is not None), default=None),
            "eval_time_max_s": max((float(x) for x in evals if x is not None), default=None),
            "artifact_bytes_max": max(sizes),
        }

    def levers(self) -> list[tuple[str, tuple[Any, ...]]]:
        """(lever, credits) of each lever the runs' config turns on, from conf/track/attribution/."""
        return levers_used(RECORD_NAME, self.runs[0].config)

    def attribution(self) -> dict[str, str]:
        """The records' attribution block: each lever used -> the merged records (PRs) that introduced it."""
        return {lever: ", ".join(_credit(c) for c in credits) for lever, credits in self.levers()}

    def limits_lines(self) -> list[str]:
        """The README's times and bytes against the record track's limits, and any projection the runs made."""
        lines = ["## Limits", "", *limits_table(self.labelled()), ""]
        for run in self.runs:
            r = run.result
            if r.get("track_projection"):
                lines += [
                    f"seed {run.seed}: about {r.get('track_projected_train_seconds')} s of training and "
                    f"{r.get('track_projected_eval_seconds')} s of evaluation on the track's machine "
                    f"({r['track_projection']}).",
                    "",
                ]
        return lines

    def code_problems(self) -> list[str]:
        """Why the shipped train_gpt.py is not shown to be the runs' (each run --force exported anyway)."""
        return [run.code_problem for run in self.runs if run.code_problem]

    def default_blurb(self) -> str:
        r = self.runs[0].result
        bpb = self.values(self.bpb_key)
        middle, spread = mean(bpb), std(bpb)
        score = "?" if middle is None else f"{middle:.4f}"
        if spread is not None:
            score += f" ± {spread:.4f} over {len(bpb)} seeds"
        ttt = ", with test-time training" if self.bpb_key == "val_bpb_ttt" else ""
        quant = f"{r.get('quant')}+{r.get('compressor')}" if r.get("quant") else "unquantized"
        return (
            f"speedrun {r.get('model')} ({_n(r.get('params'))} parameters), trained {_seconds(r.get('train_seconds'))} "
            f"on {self.hardware()}: val_bpb {score} ({self.bpb_key}{ttt}); {quant} artifact of "
            f"{max(self.total(run) for run in self.runs):,} bytes"
        )

    def submission_json(self) -> dict[str, Any]:
        """The fields parameter-golf's records carry; never NaN or infinity (JSON has neither: null instead)."""
        return _no_nan(self._submission_json())

    def _submission_json(self) -> dict[str, Any]:
        first = self.runs[0].result
        bpb, loss = self.values(self.bpb_key), self.values(self.loss_key)
        steps = mean(self.values("steps"))
        return {
            "author": self.author,
            "github_id": self.github_id,
            "name": self.name,
            "blurb": self.blurb or self.default_blurb(),
            "date": self.date,
            **self.track_claim(),
            "val_bpb": _round(mean(bpb)),
            "val_bpb_std": _round(std(bpb)),
            "val_loss": _round(mean(loss)),
            "val_loss_std": _round(std(loss)),
            **self.significance(),
            "compliance": self.compliance(),
            "attribution": self.attribution(),
            "metric": self.bpb_key,
            "bytes_total": max(self.total(run) for run in self.runs),
            "bytes_code": len(self.code),
            "bytes_model": max(int(r.result.get("artifact_model_bytes") or 0) for r in self.runs),
            "cap_bytes": self.cap(),
            "steps": round(steps) if steps is not None else None,
            "seeds": [run.seed for run in self.runs],
            "seed_results": self.seed_results(),
            "hardware": self.hardware(),
            "pytorch_version": first.get("torch_version"),
            "technique_summary": self.summary or self.settings_line(),
            "speedrun": {
                "date_source": self.date_source,
                "code_rule": "wrapped",
                "run_code_rule": first.get("artifact_code_rule"),
                "git_sha": first.get("git_sha"),
                "code_fingerprint": first.get("code_fingerprint"),
                "eval_mode": first.get("eval_mode"),
                "eval_fingerprint": first.get("eval_fingerprint"),
                "run_dirs": [str(run.dir) for run in self.runs],
                # the shipped file against the sha256 each run recorded; --force past a mismatch is said here
                "code_check": {
                    "sha256": hashlib.sha256(self.code).hexdigest(),
                    "verified": not self.code_problems(),
                    "forced": self.code_problems(),
                },
            },
        }

    def hardware(self) -> str:
        r = self.runs[0].result
        return f"{r.get('world_size') or 1}x{r.get('device_name')}"

    def settings_line(self) -> str:
        r, c = self.runs[0].result, self.runs[0].config
        quant = f"{r.get('quant')}+{r.get('compressor')}" if r.get("quant") else "no quantization"
        ttt = f", TTT {c.get('ttt', {}).get('name')}" if r.get("val_bpb_ttt") is not None else ""
        return (
            f"speedrun {r.get('model')} ({_n(r.get('params'))} parameters, seq {r.get('seq_len')}), "
            f"{_n(r.get('tokens_per_step'))} tokens/step, {r.get('precision')}, {r.get('attn_kernel')}, "
            f"{quant}{ttt}, eval {r.get('eval_mode')}"
        )

    # -- texts --------------------------------------------------------------------------------------------------
    def readme(self) -> str:
        sub = self.submission_json()
        return "\n".join(
            [
                *self._head_lines(sub),
                *self._results_lines(sub),
                *self._record_lines(sub),
                *self._technique_lines(),
                *self.limits_lines(),
                *self._settings_lines(sub),
                *self._command_lines(),
                *self._files_lines(),
            ]
        )

    def _head_lines(self, sub: dict[str, Any]) -> list[str]:
        """The title, the headline numbers, the blurb, the track claim and any unverified file."""
        n = len(self.runs)
        spread = f"{n}-seed mean ± {sub['val_bpb_std']:.6f}" if n > 1 else "1 seed"
        if sub["record_track"]:
            track = f"Track: `{sub['track']}` ({sub['track_reason']})."
        elif sub["track"] is None:
            track = f"Track: none of parameter-golf's; {sub['track_reason']}."
        else:
            track = f"Track: `{sub['track']}`; {sub['track_reason']}."
        unverified = [
            f"**{WRAPPED_FILE} is not verified as the runs' own file** (exported with --force): {problem}."
            for problem in self.code_problems()
        ]
        return [
            f"# {self.name}",
            "",
            f"**val_bpb = {sub['val_bpb']:.6f}** ({spread}; `{self.bpb_key}`) | **{sub['bytes_total']:,} bytes** "
            f"(code {sub['bytes_code']:,} + model {sub['bytes_model']:,}) | {sub['hardware']}",
            "",
            sub["blurb"],
            "",
            track,
            "",
            *[line for problem in unverified for line in (problem, "")],
            f"Run on {self.date} ({self.date_source}); exported by speedrun (`python -m speedrun.export`) on "
            f"{time.strftime('%Y-%m-%d')} from {n} run(s).",
            "",
        ]

    def _results_lines(self, sub: dict[str, Any]) -> list[str]:
        """Per seed (and their mean ± std): the score, the loss, the score before export, steps, time and bytes."""
        rows = [
            [
                seed,
                v["val_bpb"],
                v["val_loss"],
                v["val_bpb_prequant"],
                v["steps"],
                v["train_time_s"],
                f"{v['artifact_bytes']:,}",
            ]
            for seed, v in sub["seed_results"].items()
        ]
        if len(self.runs) > 1:
            loss = mean_std_cell(sub["val_loss"], std(self.values(self.loss_key)), "{:.6f}")
            rows.append(
                ["mean ± std", mean_std_cell(sub["val_bpb"], sub["val_bpb_std"], "{:.6f}"), loss, "", "", "", ""]
            )
        table = format_table(
            ["seed", f"val_bpb ({self.bpb_key})", "val_loss", "val_bpb before export", "steps", "train s", "bytes"],
            rows,
        )
        ok = all(self.total(run) <= self.cap() for run in self.runs)
        meaning = {
            "val_bpb_ttt": "after score-first test-time training on the dequantized artifact.",
            "val_bpb_quant": "the dequantized artifact, scored on the validation split.",
            "val_bpb": "the trained model (no quantized artifact).",
        }[self.bpb_key]
        return [
            "## Results",
            "",
            table,
            "",
            f"Artifacts (code + model) {'all within' if ok else 'NOT all within'} the cap of {self.cap():,} bytes. "
            f"`val_bpb` is `{self.bpb_key}`: {meaning}",
            "",
        ]

    def _record_lines(self, sub: dict[str, Any]) -> list[str]:
        """The delta against the standing record and its significance, as the records' READMEs give them."""
        ref = sub["comparison_record"]
        if ref is None:
            return ["## Against the record", "", f"{sub['significance_test']}.", ""]
        bpb = f" ({sub['delta_vs_record_bpb']:+.5f} bpb)" if sub["delta_vs_record_bpb"] is not None else ""
        delta = f"{sub['delta_vs_record_nats']:+.5f} nats{bpb}" if sub["delta_vs_record_nats"] is not None else "?"
        p = "" if sub["p_value"] is None else f", t = {sub['t_statistic']:.3f}, p = {sub['p_value']:.3g}"
        published = f"val_loss {ref['val_loss']:.5f}" if ref["val_loss"] is not None else "no val_loss published"
        return [
            "## Against the record",
            "",
            f"Standing record: {ref['name']}, {published}"
            + (f", val_bpb {ref['val_bpb']:.5f}" if ref["val_bpb"] is not None else "")
            + (f", {ref['n']} seeds" if ref["n"] else "")
            + f" ({ref['source']}).",
            "",
            f"This submission's `{sub['scored_loss']}`: {delta} against it{p} ({sub['significance_test']}); "
            f"parameter-golf asks {load_track(RECORD_NAME).acceptance.text()}.",
            "",
        ]

    def _technique_lines(self) -> list[str]:
        """What the recipe does, lever by lever, with the merged records that introduced each (the credits)."""
        levers = self.levers()
        if not levers:
            return ["## Technique", "", f"- {self.settings_line()}", ""]
        lines = ["## Technique", "", f"{self.settings_line()}. The levers it turns on, and where each comes from:", ""]
        lines += [f"- {lever}: {', '.join(_credit(c) for c in credits)}" for lever, credits in levers]
        return [*lines, "", "Credits: conf/track/attribution/pgolf_10min_16mb.yaml in speedrun.", ""]

    def _settings_lines(self, sub: dict[str, Any]) -> list[str]:
        """What was run: the levers, the budget, the data, the command line, and the card."""
        r = self.runs[0].result
        data = self.runs[0].config.get("data", {})
        overrides = " ".join(self.runs[0].overrides())
        card = f" (card table: {r['card']})" if r.get("card") else ""
        return [
            "## Settings",
            "",
            f"- {self.settings_line()}",
            f"- budget: {r.get('train_seconds')} s of training ({r.get('budget_end')} ended it), "
            f"{_n(r.get('tokens'))} tokens in {r.get('steps')} steps",
            f"- data: {data.get('name')} (vocab {data.get('vocab_size')}), {_n(r.get('eval_tokens'))} validation "
            f"tokens scored (fingerprint {r.get('eval_fingerprint')})",
            f"- made with: `python -m run {overrides}`" if overrides else "- made with: `python -m run`",
            f"- the run's settings, frozen, end {HUMAN_FILE} (`PLAN`) and are inside {WRAPPED_FILE}; speedrun "
            f"`{r.get('git_sha')}`",
            "",
            "## Card",
            "",
            f"{sub['hardware']}{card}, "
            f"torch {r.get('torch_version')}, precision {r.get('precision')}, attention {r.get('attn_kernel')}.",
            "",
        ]

    def _command_lines(self) -> list[str]:
        """How to re-run it, and how its code is counted."""
        world = int(self.runs[0].result.get("world_size") or 1)
        run_cmd = (
            f"torchrun --standalone --nproc_per_node={world} {WRAPPED_FILE}" if world > 1 else f"python {WRAPPED_FILE}"
        )
        data = self.runs[0].config.get("data", {})
        if data.get("path") and data.get("tokenizer") == "gpt2":  # tiktoken's named vocabulary: no file to point at
            data_env = f"DATA_PATH=<{data.get('name')} shards> "
        elif data.get("path"):
            data_env = f"DATA_PATH=<{data.get('name')} shards> TOKENIZER_PATH=<their tokenizer .model> "
        else:
            data_env = "DATA_PATH=<the embedded corpus's dataset dir, built by `python -m run` in data.cache_dir> "
        raw = self.raw_code_bytes()
        return [
            "## Command",
            "",
            "```bash",
            "pip install -r requirements.txt",
            f"{data_env}SEED=<seed> {run_cmd}",
            "```",
            "",
            f"{WRAPPED_FILE} is one module, minified and compressed: speedrun's exported driver, the part of its "
            "core the run reaches, and the run's frozen settings. It trains, quantizes and scores the run again with "
            "DATA_PATH, TOKENIZER_PATH and SEED when set (the ranks from torchrun), writes the model as "
            "final_model.<quant>.<compressor> and prints the result lines; it needs no speedrun."
            + (
                f" {HUMAN_FILE} is the same module to read, comments kept, before it was minified and compressed "
                f"into {WRAPPED_FILE}; it runs the same way and re-runs the same run, but only {WRAPPED_FILE} is "
                "counted."
                if self.human is not None
                else ""
            ),
            "",
            "## Code size",
            "",
            f"Code bytes are the length of {WRAPPED_FILE}: {len(self.code):,}"
            + (f" (the same source counted raw: {raw:,} bytes)." if raw else "."),
            "",
        ]

    def _files_lines(self) -> list[str]:
        return [
            "## Files",
            "",
            f"- `{WRAPPED_FILE}`: the self-extracting run, the code counted",
            *([f"- `{HUMAN_FILE}`: the same code to read (not counted)"] if self.human is not None else []),
            "- `submission.json`: the numbers above, per seed",
            "- `requirements.txt`: what parameter-golf's image lacks",
            *[f"- `{log_name(run)}`: the run's log" for run in self.runs],
            "",
        ]

    def raw_code_bytes(self) -> int | None:
        """The packed source's raw bytes, from the first run's artifact_code.json (None when it lacks them)."""
        try:
            files = json.loads((self.runs[0].dir / MANIFEST).read_text())["files"]
            return sum(int(f["raw_bytes"]) for f in files)
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def requirements(self) -> str:
        env = self.runs[0].env()
        needs = requirements(self.runs[0].config)
        if compressor_of(self.code) in OPTIONAL:  # the file's own decoder is a package (brotli)
            needs[OPTIONAL[compressor_of(self.code)][0]] = OPTIONAL[compressor_of(self.code)][1]
        lines = ["# speedrun's train_gpt.py needs these beyond parameter-golf's requirements.txt"]
        for module, spec in needs.items():
            if module in PGOLF_IMAGE:
                continue
            version = env.get(f"{module}_version")
            lines.append(f"{spec.split('>=')[0]}=={version}" if version else spec)
        return "\n".join(lines) + "\n"


def log_name(run: Run) -> str:
    return f"train_seed{run.seed}.log"


def _n(x: Any) -> str:
    """A count with thousands separators; what a record lacks as "?"."""
    return f"{x:,}" if isinstance(x, int) else "?" if x is None else str(x)


def _seconds(x: Any) -> str:
    return "? s" if x is None else f"{float(x):.0f} s"


def _round(x: float | None) -> float | None:
    return None if x is None or not math.isfinite(x) else round(x, 8)


def _credit(c: Any) -> str:
    return (
        f"PR #{c.pr} ({c.what}; records/track_10min_16mb/{c.folder})"
        if c.pr
        else f"{c.what} (records/track_10min_16mb/{c.folder})"
    )


def _no_nan(tree: Any) -> Any:
    """The tree with every NaN or infinite float as None: json.dumps would write NaN, which JSON does not have."""
    if isinstance(tree, float):
        return tree if math.isfinite(tree) else None
    if isinstance(tree, dict):
        return {k: _no_nan(v) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return [_no_nan(v) for v in tree]
    return tree


_RUN_DIR_DATE = re.compile(r"(\d{4}-\d{2}-\d{2})")


def run_date(runs: list[Run]) -> tuple[str, str]:
    """(YYYY-MM-DD, where it comes from) of the runs: the last one's end (result.json's heartbeat_at), else the date
    in its run dir's path (Hydra's outputs/runs/<date>/...), else today (the export's)."""
    stamps = [r.result.get("heartbeat_at") for r in runs]
    known = [float(t) for t in stamps if isinstance(t, (int, float)) and math.isfinite(t)]
    if known:
        return time.strftime("%Y-%m-%d", time.gmtime(max(known))), "the last run's end, UTC"
    for run in reversed(runs):
        if (m := _RUN_DIR_DATE.search(str(run.result.get("run_dir") or run.dir))) is not None:
            return m.group(1), "the run dir's date"
    return time.strftime("%Y-%m-%d"), "the export's date: the runs record none"
