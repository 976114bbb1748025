"""`python -m speedrun.report --open`: the written report.html goes to the web browser, as a file URI; where no
browser is found (a server, CI) one line says so and names the file, and the report still exits 0."""

from __future__ import annotations

import webbrowser
from pathlib import Path

from speedrun import report
from speedrun.records.store import ResultsDB


def _db(root: Path) -> Path:
    path = root / "results.sqlite"
    db = ResultsDB(path)
    for i in range(2):
        db.upsert(f"run{i}", {"name": "t", "started_at": 1000.0 + i, "status": "ok", "val_bpb": 1.0 + i, "seed": i})
    return path


def test_open_hands_the_page_to_the_browser(tmp_path, monkeypatch, capsys):
    opened: list[str] = []
    monkeypatch.setattr(webbrowser, "open", lambda url, *a, **k: opened.append(url) or True)
    out = tmp_path / "report"
    assert report.main(["--db", str(_db(tmp_path)), "--out", str(out), "--no-plots", "--open"]) == 0
    assert opened == [(out / "report.html").resolve().as_uri()]
    assert (out / "report.html").is_file() and "--open:" not in capsys.readouterr().out


def test_open_without_a_browser_says_so_in_one_line(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(webbrowser, "open", lambda url, *a, **k: False)
    out = tmp_path / "report"
    assert report.main(["--db", str(_db(tmp_path)), "--out", str(out), "--no-plots", "--open"]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("--open:")]
    assert lines == [
        f"--open: no web browser to open it here; open {(out / 'report.html').resolve()} on a machine with one"
    ]


def test_without_open_no_browser_is_asked(tmp_path, monkeypatch):
    monkeypatch.setattr(webbrowser, "open", lambda *a, **k: (_ for _ in ()).throw(AssertionError("opened")))
    assert report.main(["--db", str(_db(tmp_path)), "--out", str(tmp_path / "r"), "--no-plots"]) == 0
