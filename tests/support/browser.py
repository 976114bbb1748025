"""The report's HTML page in a real browser: headless Chromium opens it alone in an empty directory and says what it
saw after load (test_report's synthetic page, and the real sweep's)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest


def chromium() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        if shutil.which(name):
            return shutil.which(name)
    return None


_PROBE = """<script>
window.addEventListener('load', () => {
  const imgs = Array.from(document.images);
  document.body.setAttribute('data-images', imgs.length);
  document.body.setAttribute('data-images-loaded', imgs.filter(i => i.complete && i.naturalWidth > 0).length);
  document.body.setAttribute('data-rows', document.querySelectorAll('#leaderboard tbody tr').length);
});
</script>"""


def check_in_browser(html_path: Path, tmp_path: Path) -> dict[str, int]:
    """Open a copy of the report, alone in an empty dir (so only embedded images can load), in headless chromium.
    Returns the image and row counts the page saw after load, and checks that it renders a screenshot."""
    exe = chromium()
    if exe is None:
        pytest.skip("no chromium: `apt-get install -y chromium` (Debian) to run the headless-browser test")
    alone = tmp_path / "alone"
    alone.mkdir()
    page = alone / "report.html"
    page.write_text(html_path.read_text().replace("</body>", _PROBE + "</body>"))
    base = [
        exe,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-dev-shm-usage",
        "--no-first-run",
        f"--user-data-dir={tmp_path / 'profile'}",
        "--virtual-time-budget=10000",
    ]
    env = {"HOME": str(tmp_path), "PATH": "/usr/bin:/bin"}
    dom = subprocess.run([*base, "--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120, env=env)
    assert dom.returncode == 0, dom.stderr[-2000:]
    shot = tmp_path / "shot.png"
    subprocess.run(
        [*base, f"--screenshot={shot}", "--window-size=1400,2400", page.as_uri()],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
    )
    assert shot.exists() and shot.stat().st_size > 10_000, "the page did not render"
    found = {}
    for key in ("data-images", "data-images-loaded", "data-rows"):
        m = re.search(rf'{key}="(\d+)"', dom.stdout)
        assert m, f"{key} missing: the load handler did not run\n{dom.stdout[:2000]}"
        found[key] = int(m.group(1))
    return found
