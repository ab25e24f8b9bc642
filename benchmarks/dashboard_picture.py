"""Regenerate ``docs/dashboard.png``, the README's picture, from the demo as it now runs.

Runs ``cliptrack demo`` into ``build/dashboard-picture/`` (or ``--out``), takes a headless Chromium
screenshot of its ``dashboard.html`` at 1400 px, and writes it with the dashboard's headline in the
PNG's text chunk ``cliptrack-headline``: ``tests/test_demo.py`` compares that line with what the
demo prints now (numbers aside), so a picture that no longer shows the demo fails the suite.

Run: ``make docs-picture`` (or ``python -m benchmarks.dashboard_picture``); needs Debian's
``chromium``.
"""

from __future__ import annotations

import argparse
import html
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PICTURE = ROOT / "docs" / "dashboard.png"
HEADLINE_KEY = "cliptrack-headline"
"""PNG text chunk holding the dashboard's headline (its lines joined by newlines)."""
WINDOW = (1400, 1500)
"""Screenshot size in pixels: the dashboard's design width, the headline and the difference plots."""


def dashboard_headline(page: str) -> str:
    """The headline of a dashboard page (the text of its ``id="headline"`` element)."""
    found = re.search(r'<p class="headline [^"]*" id="headline">(.*?)</p>', page, re.S)
    if found is None:
        raise ValueError("no headline in the dashboard page")
    return html.unescape(found.group(1))


def picture_headline(path: Path = PICTURE) -> str:
    """The headline recorded in a picture written by ``write_picture`` ("" when none)."""
    from PIL import Image

    with Image.open(path) as image:
        return str(image.text.get(HEADLINE_KEY, "")) if hasattr(image, "text") else ""


def shape(headline: str) -> str:
    """A headline with its numbers masked: what must not change between two demo runs."""
    return re.sub(r"\d+(\.\d+)?", "#", headline)


def write_picture(dashboard: Path, out: Path = PICTURE) -> Path:
    """Screenshot ``dashboard`` in headless Chromium and write it to ``out`` with its headline."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        raise SystemExit("dashboard_picture: no chromium on PATH (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as tmp:
        shot = Path(tmp) / "shot.png"
        subprocess.run(
            [
                chromium,
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--hide-scrollbars",
                f"--user-data-dir={Path(tmp) / 'profile'}",
                f"--window-size={WINDOW[0]},{WINDOW[1]}",
                "--virtual-time-budget=15000",
                f"--screenshot={shot}",
                dashboard.resolve().as_uri(),
            ],
            check=True,
            capture_output=True,
            timeout=180,
        )
        info = PngInfo()
        info.add_text(HEADLINE_KEY, dashboard_headline(dashboard.read_text(encoding="utf-8")))
        with Image.open(shot) as image:
            image.save(out, pnginfo=info, optimize=True)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "build" / "dashboard-picture")
    args = parser.parse_args(argv)
    subprocess.run(
        [sys.executable, "-m", "cliptrack.cli.main", "demo", "--out", str(args.out)],
        check=True,
        stdout=subprocess.DEVNULL,
    )
    path = write_picture(args.out / "dashboard.html")
    print(f"{path}: {picture_headline(path).splitlines()[0]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
