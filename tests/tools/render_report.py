#!/usr/bin/env python3
"""specdec-generate --report renders: the SVG file and the HTML page are drawn by headless
Chromium (Debian's chromium), and each screenshot must show a picture: not blank, in several
colours, with the report's colours (the accepted green, the bonus amber, the root blue) present.

usage: render_report.py GENERATE MODEL TOKENIZER

Without chromium the test is skipped (exit status 77, which ctest reports as skipped) with a
message saying so, unless SPECDEC_REQUIRE_CHROMIUM=1 (CI sets it: .ci/run installs chromium),
where a missing chromium fails the test.
"""

import os
import shutil
import struct
import subprocess
import sys
import tempfile
import zlib

SKIP = 77


def chromium():
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    return None


def read_png(path):
    """(width, height, rows of (r, g, b) pixels) of an 8-bit RGB or RGBA PNG."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError(f"{path}: not a PNG file")
    pos, idat = 8, b""
    width = height = depth = colour = None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind = data[pos + 4 : pos + 8]
        body = data[pos + 8 : pos + 8 + length]
        pos += 12 + length
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", body[:10])
        elif kind == b"IDAT":
            idat += body
        elif kind == b"IEND":
            break
    if depth != 8 or colour not in (2, 6):
        raise ValueError(f"{path}: unsupported PNG (bit depth {depth}, colour type {colour})")
    channels = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * channels
    rows, previous = [], bytearray(stride)
    for y in range(height):
        start = y * (stride + 1)
        kind, line = raw[start], bytearray(raw[start + 1 : start + 1 + stride])
        for i in range(stride):
            a = line[i - channels] if i >= channels else 0
            b = previous[i]
            c = previous[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        rows.append([tuple(line[x * channels : x * channels + 3]) for x in range(width)])
        previous = line
    return width, height, rows


def near(colour, target, tolerance=40):
    return all(abs(a - b) <= tolerance for a, b in zip(colour, target))


def check_picture(png, what):
    width, height, rows = read_png(png)
    counts = {}
    for row in rows:
        for p in row:
            counts[p] = counts.get(p, 0) + 1
    total = width * height
    background = max(counts.items(), key=lambda kv: kv[1])[0]
    other = total - counts[background]
    print(f"{what}: {width}x{height}, {len(counts)} colours, {100.0 * other / total:.1f}% of the "
          f"pixels differ from the background {background}")
    problems = []
    if other < total // 100:
        problems.append("the picture is blank (fewer than 1% of its pixels differ from the "
                        "background)")
    if len(counts) < 8:
        problems.append(f"the picture has only {len(counts)} colours")
    # The report's colours: accepted (#16a34a), bonus (#f59e0b), root and bars (#2563eb).
    for name, target in (("green", (0x16, 0xA3, 0x4A)), ("amber", (0xF5, 0x9E, 0x0B)),
                         ("blue", (0x25, 0x63, 0xEB))):
        if sum(n for p, n in counts.items() if near(p, target)) < 20:
            problems.append(f"no {name} in the picture")
    return problems


def main():
    if len(sys.argv) != 4:
        print(__doc__)
        return 2
    generate, model, tokenizer = sys.argv[1:]
    browser = chromium()
    if browser is None:
        if os.environ.get("SPECDEC_REQUIRE_CHROMIUM") == "1":
            print("FAIL: chromium is not installed, and SPECDEC_REQUIRE_CHROMIUM=1 requires it "
                  "(apt-get install chromium)")
            return 1
        print("SKIPPED: chromium is not installed, so the --report pictures cannot be rendered "
              "(apt-get install chromium; CI sets SPECDEC_REQUIRE_CHROMIUM=1 to require it)")
        return SKIP
    work = tempfile.mkdtemp(prefix="specdec_report_")
    try:
        failures = []
        for ext in ("svg", "html"):
            report = os.path.join(work, f"run.{ext}")
            cmd = [generate, "--model", model, "--tokenizer", tokenizer, "--prompt",
                   "Once upon a time", "-n", "60", "--strategy", "prompt-lookup", "--branches",
                   "3", "--json", "--report", report]
            run = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
            if run.returncode != 0:
                failures.append(f"{ext}: specdec-generate exited {run.returncode}: {run.stderr}")
                continue
            png = os.path.join(work, f"run_{ext}.png")
            profile = tempfile.mkdtemp(prefix="specdec_chromium_", dir=work)
            shot = subprocess.run(
                [browser, "--headless", "--no-sandbox", "--disable-gpu",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                 f"--screenshot={png}", "--window-size=1200,900", "file://" + report],
                capture_output=True, text=True, timeout=300)
            if not os.path.exists(png):
                failures.append(f"{ext}: chromium wrote no screenshot (exit {shot.returncode}): "
                                f"{shot.stderr[-2000:]}")
                continue
            keep = os.environ.get("SPECDEC_REPORT_SCREENSHOTS")
            if keep:
                shutil.copy(png, os.path.join(keep, f"report_{ext}.png"))
            failures += [f"{ext}: {p}" for p in check_picture(png, f"report.{ext}")]
        for f in failures:
            print("FAIL:", f)
        return 1 if failures else 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
