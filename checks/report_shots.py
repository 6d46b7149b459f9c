"""Screenshots of HTML pages (``report.html``, ``compare.html``) in headless Chromium.

So anyone can look at a report as a browser shows it before publishing it::

    make report-shots      # the demo's report and comparison → out/shots/
    python -m checks.report_shots out/demo/report.html out/compare/compare.html --out out/shots

Per page, ``<folder>_<name>.png`` is the whole page (1400 px wide; the window is made tall enough and the
blank below the content is cropped) and ``<folder>_<name>_partNN.png`` are slices of it a screen high,
easier to look at. Needs Chromium (Debian: ``apt-get install chromium``; or ``$CHROMIUM``) and
Pillow (installed with matplotlib). Not part of the test suite.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from PIL import Image, ImageChops

WIDTH = 1400
#: the first window height tried, and the most (a taller page is cut there, with a note)
START_HEIGHT = 8000
MAX_HEIGHT = 32000
#: height of each slice of the whole page
PART_HEIGHT = 1800
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable")


class ShotError(Exception):
    """A screenshot that could not be taken: the message says why."""


def find_chromium() -> str:
    """The browser: ``$CHROMIUM``, else the first of :data:`BROWSERS` on PATH."""
    candidates = [os.environ["CHROMIUM"]] if os.environ.get("CHROMIUM") else list(BROWSERS)
    for name in candidates:
        found = shutil.which(name)
        if found:
            return found
    raise ShotError(
        "no Chromium found (looked for "
        + ", ".join(candidates)
        + "): install it with `apt-get install chromium` (Debian/Ubuntu; as root, after "
        "`apt-get update`), or set CHROMIUM=/path/to/chrome"
    )


def _capture(browser: str, page: Path, png: Path, height: int) -> None:
    with tempfile.TemporaryDirectory(prefix="report-shots-") as profile:
        command = [
            browser,
            "--headless",
            "--no-sandbox",  # root in a container has no user namespace for the sandbox
            "--disable-gpu",
            "--hide-scrollbars",
            "--force-device-scale-factor=1",
            "--virtual-time-budget=5000",  # let the embedded images decode
            f"--user-data-dir={profile}",
            f"--window-size={WIDTH},{height}",
            f"--screenshot={png}",
            page.resolve().as_uri(),
        ]
        done = subprocess.run(command, capture_output=True, text=True, timeout=180, check=False)
    if done.returncode != 0 or not png.is_file():
        tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
        raise ShotError(f"{browser} could not render {page}: {' / '.join(tail)}")


def _content_bottom(image: Image.Image) -> int:
    """The last row that is not page background (the bottom-right pixel's colour)."""
    rgb = image.convert("RGB")
    background = Image.new("RGB", rgb.size, rgb.getpixel((rgb.width - 1, rgb.height - 1)))
    box = ImageChops.difference(rgb, background).getbbox()
    return box[3] if box else 0


def shoot(browser: str, page: Path, out: Path) -> list[Path]:
    """``out/<folder>_<name>.png`` (the whole page) and its slices; returns the files written."""
    out.mkdir(parents=True, exist_ok=True)
    name = f"{page.resolve().parent.name}_{page.stem}"
    png = out / f"{name}.png"
    height = START_HEIGHT
    while True:
        _capture(browser, page, png, height)
        with Image.open(png) as image:
            bottom = _content_bottom(image)
            if bottom < image.height - 16 or height >= MAX_HEIGHT:
                if bottom >= image.height - 16:
                    print(f"note: {page} is taller than {MAX_HEIGHT} px: cut there")
                whole = image.crop((0, 0, image.width, min(bottom + 32, image.height)))
                break
        height = min(2 * height, MAX_HEIGHT)
    whole.save(png)
    for old in out.glob(f"{name}_part*.png"):
        old.unlink()
    written = [png]
    for i, top in enumerate(range(0, whole.height, PART_HEIGHT), start=1):
        part = out / f"{name}_part{i:02d}.png"
        whole.crop((0, top, whole.width, min(top + PART_HEIGHT, whole.height))).save(part)
        written.append(part)
    return written


def main(argv: list[str] | None = None) -> int:
    """Screenshot each page; exit status 2 with one line when that is not possible."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("pages", nargs="+", type=Path, help="HTML files to render")
    parser.add_argument("--out", type=Path, default=Path("out/shots"), help="folder for PNGs")
    args = parser.parse_args(argv)
    try:
        browser = find_chromium()
        for page in args.pages:
            if not page.is_file():
                raise ShotError(f"{page}: no such file (run `make demo` first)")
            written = shoot(browser, page, args.out)
            print(f"{page} → {written[0]} ({len(written) - 1} part(s))")
    except (ShotError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
