#!/usr/bin/env python3
"""Chart of a `specdec-kimi bench --json` sweep as a PNG, in standard-library Python only.

  bench_plot.py FILE.json --out PLOT.png [--title TEXT] [--batch B]
  bench_plot.py --self-test [--out SAMPLE.png]   (ctest demo.bench_plot; --out keeps its PNG)

Input: the JSON that `specdec-kimi bench --json FILE` writes for one batch size: a header (device, batch,
prompts, max_new_tokens, model_path, draft_path), "configs" (configs[0] the NONE baseline, then
the speculative configurations measured) and "advisor" (its "choice" and the "measured_best").
Output: a 900x560 PNG (8-bit RGB, written with zlib and struct), two stacked panels with one
group per configuration, the names and values under the bars:
  1. speedup over NONE (decode tokens/s): measured bars, the advisor's choice in orange, a dashed
     line at 1.0, the advisor's predicted speedup (predicted_decode_tokens_per_s / NONE's
     decode_tokens_per_s) as a red diamond, the measured best pointed at by a black triangle;
  2. accept length (teal bars, left axis) and the "efficiency" field, speedup / accept length
     (purple dots, right axis).
Above them a title line (--title, device, batch, prompts, max_new_tokens) and a line with the
model, the draft, NONE's decode rate and the advisor's result. Text is drawn with the 5x8 pixel
font embedded below. The same JSON gives the same bytes. A file that is not such JSON (no
"configs", NONE not first, a value that is not a number, ...) is refused: exit 2, the problem named.
A sweep at several batch sizes (`--batch 1,4,16`: {"batches": [one such object per batch size],
"draft_steps_plan"}) is plotted at --batch B (default: the first batch size measured).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import struct
import subprocess
import sys
import tempfile
import zlib

# ---------------------------------------------------------------------------------------------
# Font: printable ASCII 32..126 in order, 16 glyphs a band, 5 columns x 8 rows each ('X' ink);
# rows 0-6 above the baseline, row 7 for descenders. The '>' lines only name the glyphs.
_FONT_SHEET = r"""
>       !     "     #     $     %     &     '     (     )     *     +     ,     -     .     /
..... ..X.. .X.X. .X.X. ..X.. XX... .XX.. .XX.. ...X. .X... ..... ..... ..... ..... ..... .....
..... ..X.. .X.X. .X.X. .XXXX XX..X X..X. ..X.. ..X.. ..X.. .X.X. ..X.. ..... ..... ..... ....X
..... ..X.. .X.X. XXXXX X.X.. ...X. X.X.. .X... .X... ...X. ..X.. ..X.. ..... ..... ..... ...X.
..... ..X.. ..... .X.X. .XXX. ..X.. .X... ..... .X... ...X. XXXXX XXXXX ..... XXXXX ..... ..X..
..... ..X.. ..... XXXXX ..X.X .X... X.X.X ..... .X... ...X. ..X.. ..X.. ..... ..... ..... .X...
..... ..... ..... .X.X. XXXX. X..XX X..X. ..... ..X.. ..X.. .X.X. ..X.. .XX.. ..... .XX.. X....
..... ..X.. ..... .X.X. ..X.. ...XX .XX.X ..... ...X. .X... ..... ..... ..X.. ..... .XX.. .....
..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... .X... ..... ..... .....
> 0     1     2     3     4     5     6     7     8     9     :     ;     <     =     >     ?
.XXX. ..X.. .XXX. XXXXX ...X. XXXXX ..XX. XXXXX .XXX. .XXX. ..... ..... ....X ..... X.... .XXX.
X...X .XX.. X...X ...X. ..XX. X.... .X... ....X X...X X...X .XX.. .XX.. ...X. ..... .X... X...X
X..XX ..X.. ....X ..X.. .X.X. XXXX. X.... ...X. X...X X...X .XX.. .XX.. ..X.. XXXXX ..X.. ....X
X.X.X ..X.. ...X. ...X. X..X. ....X XXXX. ..X.. .XXX. .XXXX ..... ..... .X... ..... ...X. ...X.
XX..X ..X.. ..X.. ....X XXXXX ....X X...X .X... X...X ....X .XX.. ..... ..X.. XXXXX ..X.. ..X..
X...X ..X.. .X... X...X ...X. X...X X...X .X... X...X ...X. .XX.. .XX.. ...X. ..... .X... .....
.XXX. .XXX. XXXXX .XXX. ...X. .XXX. .XXX. .X... .XXX. .XX.. ..... ..X.. ....X ..... X.... ..X..
..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... .X... ..... ..... ..... .....
> @     A     B     C     D     E     F     G     H     I     J     K     L     M     N     O
.XXX. .XXX. XXXX. .XXX. XXX.. XXXXX XXXXX .XXX. X...X .XXX. ..XXX X...X X.... X...X X...X .XXX.
X...X X...X X...X X...X X..X. X.... X.... X...X X...X ..X.. ...X. X..X. X.... XX.XX X...X X...X
....X X...X X...X X.... X...X X.... X.... X.... X...X ..X.. ...X. X.X.. X.... X.X.X XX..X X...X
.XX.X X...X XXXX. X.... X...X XXXX. XXX.. X.... XXXXX ..X.. ...X. XX... X.... X...X X.X.X X...X
X.X.X XXXXX X...X X.... X...X X.... X.... X..XX X...X ..X.. ...X. X.X.. X.... X...X X..XX X...X
X.X.X X...X X...X X...X X..X. X.... X.... X...X X...X ..X.. X..X. X..X. X.... X...X X...X X...X
.XXX. X...X XXXX. .XXX. XXX.. XXXXX X.... .XXX. X...X .XXX. .XX.. X...X XXXXX X...X X...X .XXX.
..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... .....
> P     Q     R     S     T     U     V     W     X     Y     Z     [     \     ]     ^     _
XXXX. .XXX. XXXX. .XXXX XXXXX X...X X...X X...X X...X X...X XXXXX ..XXX ..... XXX.. ..X.. .....
X...X X...X X...X X.... ..X.. X...X X...X X...X X...X X...X ....X ..X.. X.... ..X.. .X.X. .....
X...X X...X X...X X.... ..X.. X...X X...X X...X .X.X. .X.X. ...X. ..X.. .X... ..X.. X...X .....
XXXX. X...X XXXX. .XXX. ..X.. X...X X...X X.X.X ..X.. ..X.. ..X.. ..X.. ..X.. ..X.. ..... .....
X.... X.X.X X.X.. ....X ..X.. X...X X...X X.X.X .X.X. ..X.. .X... ..X.. ...X. ..X.. ..... .....
X.... X..X. X..X. ....X ..X.. X...X .X.X. XX.XX X...X ..X.. X.... ..X.. ....X ..X.. ..... .....
X.... .XX.X X...X XXXX. ..X.. .XXX. ..X.. X...X X...X ..X.. XXXXX ..XXX ..... XXX.. ..... XXXXX
..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... ..... .....
> `     a     b     c     d     e     f     g     h     i     j     k     l     m     n     o
.X... ..... X.... ..... ....X ..... ..XX. ..... X.... ..X.. ...X. .X... .XX.. ..... ..... .....
..X.. ..... X.... ..... ....X ..... .X..X ..... X.... ..... ..... .X... ..X.. ..... ..... .....
...X. .XXX. X.XX. .XXX. .XX.X .XXX. .X... .XXXX X.XX. .XX.. ..XX. .X..X ..X.. XX.X. X.XX. .XXX.
..... ....X XX..X X.... X..XX X...X XXX.. X...X XX..X ..X.. ...X. .X.X. ..X.. X.X.X XX..X X...X
..... .XXXX X...X X.... X...X XXXXX .X... X...X X...X ..X.. ...X. .XX.. ..X.. X.X.X X...X X...X
..... X...X X...X X...X X...X X.... .X... .XXXX X...X ..X.. ...X. .X.X. ..X.. X...X X...X X...X
..... .XXXX XXXX. .XXX. .XXXX .XXX. .X... ....X X...X .XXX. X..X. .X..X .XXX. X...X X...X .XXX.
..... ..... ..... ..... ..... ..... ..... .XXX. ..... ..... .XX.. ..... ..... ..... ..... .....
> p     q     r     s     t     u     v     w     x     y     z     {     |     }     ~
..... ..... ..... ..... .X... ..... ..... ..... ..... ..... ..... ...X. ..X.. .X... .....
..... ..... ..... ..... .X... ..... ..... ..... ..... ..... ..... ..X.. ..X.. ..X.. .....
XXXX. .XXXX X.XX. .XXX. XXX.. X...X X...X X...X X...X X...X XXXXX ..X.. ..X.. ..X.. .X...
X...X X...X XX..X X.... .X... X...X X...X X...X .X.X. X...X ...X. .X... ..X.. ...X. X.X.X
X...X X...X X.... .XXX. .X... X...X X...X X.X.X ..X.. X...X ..X.. ..X.. ..X.. ..X.. ...X.
X...X X...X X.... ....X .X..X X..XX .X.X. X.X.X .X.X. .XXXX .X... ..X.. ..X.. ..X.. .....
XXXX. .XXXX X.... XXXX. ..XX. .XX.X ..X.. .X.X. X...X ....X XXXXX ...X. ..X.. .X... .....
X.... ....X ..... ..... ..... ..... ..... ..... ..... .XXX. ..... ..... ..... ..... .....
"""


def _parse_font(sheet: str) -> dict[str, list[str]]:
    rows = [line.split(" ") for line in sheet.splitlines() if line and line[0] in ".X"]
    glyphs: dict[str, list[str]] = {}
    for band in range(0, len(rows), 8):
        for k in range(len(rows[band])):
            glyphs[chr(32 + len(glyphs))] = [rows[band + r][k] for r in range(8)]
    assert len(glyphs) == 95, len(glyphs)
    return glyphs


FONT = _parse_font(_FONT_SHEET)
ADVANCE, LINE = 6, 8  # pixels a character / a line takes at scale 1

WHITE, INK, MUTED = (255, 255, 255), (25, 25, 25), (105, 105, 105)
GRID, AXIS, BASELINE = (230, 230, 230), (70, 70, 70), (90, 90, 90)
BAR, CHOICE, PREDICTED, BEST = (76, 120, 168), (245, 133, 24), (200, 30, 45), (20, 20, 20)
ACCEPT, EFFICIENCY = (88, 165, 160), (140, 60, 150)
WIDTH, HEIGHT = 900, 560


class BenchError(Exception):
    """The input is not the JSON of specdec-kimi bench --json."""


# ---------------------------------------------------------------------------------------------
# Input


def _number(obj: dict, key: str, where: str, optional: bool = False) -> float | None:
    value = obj.get(key)
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise BenchError(f'{where}: "{key}" must be a finite number, got {json.dumps(value)}')
    if value < 0:
        raise BenchError(f'{where}: "{key}" must not be negative, got {value}')
    return float(value)


def load_bench(text: str, batch: int | None = None) -> dict:
    """Checks the bench JSON and returns what the chart needs (at `batch` for a sweep of several
    batch sizes; None: the first); BenchError names the problem."""
    try:
        doc = json.loads(text)
    except ValueError as e:
        raise BenchError(f"not JSON: {e}") from None
    if not isinstance(doc, dict):
        raise BenchError("not a bench result: the top level is not a JSON object")
    if "batches" in doc:
        runs = doc["batches"]
        if not isinstance(runs, list) or not runs or not all(isinstance(r, dict) for r in runs):
            raise BenchError('"batches" must be a non-empty list of bench results')
        sizes = [r.get("batch") for r in runs]
        if batch is None:
            doc = runs[0]
        elif batch in sizes:
            doc = runs[sizes.index(batch)]
        else:
            raise BenchError(f"no run at batch {batch}: the file has batch sizes {sizes}")
    elif batch is not None and doc.get("batch") != batch:
        raise BenchError(f"no run at batch {batch}: the file has batch {doc.get('batch')}")
    configs = doc.get("configs")
    if not isinstance(configs, list) or not configs:
        raise BenchError('not a bench result: no "configs" list (or it is empty)')
    rows = []
    for i, c in enumerate(configs):
        if not isinstance(c, dict) or not isinstance(c.get("name"), str) or not c["name"]:
            raise BenchError(f'configs[{i}]: not an object with a "name" string')
        where = f'configs[{i}] "{c["name"]}"'
        row = {"name": c["name"], "algorithm": c.get("algorithm")}
        for key in ("decode_tokens_per_s", "speedup", "accept_length", "efficiency"):
            row[key] = _number(c, key, where)
        row["predicted"] = _number(c, "predicted_decode_tokens_per_s", where, optional=True)
        rows.append(row)
    if rows[0]["algorithm"] != "NONE":
        raise BenchError(f'configs[0] must be the NONE baseline (algorithm "NONE"), got '
                         f'{json.dumps(rows[0]["algorithm"])}')
    if rows[0]["decode_tokens_per_s"] <= 0:
        raise BenchError('configs[0] "NONE": decode_tokens_per_s must be positive')
    names = [r["name"] for r in rows]
    if len(set(names)) != len(names):
        raise BenchError(f"config names are not unique: {names}")
    base = rows[0]["decode_tokens_per_s"]
    for r in rows:
        r["predicted_speedup"] = None if r["predicted"] is None else r["predicted"] / base
    bench = {"configs": rows, "base_decode_tokens_per_s": base,
             "device": str(doc.get("device", "?")),
             "model": str(doc.get("model_path", "")), "draft": str(doc.get("draft_path", ""))}
    for key in ("batch", "prompts", "max_new_tokens"):
        bench[key] = int(_number(doc, key, "header"))
    advisor = doc.get("advisor", {})
    if not isinstance(advisor, dict):
        raise BenchError('"advisor" is not an object')
    best = max(rows, key=lambda r: r["speedup"])["name"]
    for key, default in (("choice", None), ("measured_best", best)):
        value = advisor.get(key, default)
        if value is not None and value not in names:
            raise BenchError(f'advisor "{key}" {json.dumps(value)} names no config')
        bench[key] = value
    return bench


# ---------------------------------------------------------------------------------------------
# Drawing


class Canvas:
    """An RGB raster; rectangles are half-open [x0, x1) x [y0, y1) and clipped to the canvas."""

    def __init__(self, width: int, height: int):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(WHITE) * (width * height))

    def rect(self, x0, y0, x1, y1, color) -> None:
        x0, x1 = max(0, int(x0)), min(self.width, int(x1))
        y0, y1 = max(0, int(y0)), min(self.height, int(y1))
        if x0 >= x1:
            return
        run = bytes(color) * (x1 - x0)
        for y in range(y0, y1):
            start = (y * self.width + x0) * 3
            self.pixels[start:start + len(run)] = run

    def dashed_hline(self, x0, x1, y, color, dash=6, gap=4) -> None:
        for x in range(x0, x1, dash + gap):
            self.rect(x, y, min(x + dash, x1), y + 1, color)

    def diamond(self, cx, cy, r, color) -> None:
        for dy in range(-r, r + 1):
            half = r - abs(dy)
            self.rect(cx - half, cy + dy, cx + half + 1, cy + dy + 1, color)

    def disc(self, cx, cy, r, color) -> None:
        for dy in range(-r, r + 1):
            half = int(math.sqrt(r * r - dy * dy) + 0.5)
            self.rect(cx - half, cy + dy, cx + half + 1, cy + dy + 1, color)

    def triangle_down(self, cx, y, h, color) -> None:
        for i in range(h):
            self.rect(cx - (h - 1 - i), y + i, cx + h - i, y + i + 1, color)

    def text(self, x, y, s: str, color, scale: int = 1) -> None:
        for ch in s:
            glyph = FONT.get(ch, FONT["?"])
            for r, row in enumerate(glyph):
                for c, ink in enumerate(row):
                    if ink == "X":
                        px, py = x + c * scale, y + r * scale
                        self.rect(px, py, px + scale, py + scale, color)
            x += ADVANCE * scale

    def png(self) -> bytes:
        row = self.width * 3
        raw = b"".join(b"\x00" + bytes(self.pixels[y * row:(y + 1) * row])
                       for y in range(self.height))

        def chunk(kind: bytes, data: bytes) -> bytes:
            return (struct.pack(">I", len(data)) + kind + data
                    + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header)
                + chunk(b"IDAT", zlib.compress(raw, 9)) + chunk(b"IEND", b""))


def text_width(s: str, scale: int = 1) -> int:
    return max(0, len(s) * ADVANCE - 1) * scale


def fit(s: str, width: int) -> str:
    """s cut (ending in '.') to at most width pixels at scale 1."""
    if text_width(s) <= width:
        return s
    keep = max(1, (width + 1) // ADVANCE - 1)
    return s[:keep] + "."


def short_path(path: str) -> str:
    """A path cut to its last two components ('.../' before them when there were more)."""
    parts = [p for p in path.split("/") if p]
    if len(parts) <= 2:
        return path or "-"
    return ".../" + "/".join(parts[-2:])


def nice_axis(vmax: float, target: int = 5) -> tuple[list[float], int]:
    """Ticks 0, step, ..., >= vmax for a round step, and the decimals that step needs."""
    raw = max(vmax, 1e-9) / target
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw * (1 - 1e-9))
    count = math.ceil(vmax / step - 1e-9)
    decimals = next(d for d in range(6) if abs(round(step, d) - step) < 1e-9 * step)
    return [i * step for i in range(count + 1)], decimals


class Panel:
    """A plot area: n groups across [left, right), 0 at bottom, the top tick at plot_top."""

    def __init__(self, cv: Canvas, top: int, height: int, left: int, right: int, n: int):
        self.cv, self.left, self.right = cv, left, right
        self.plot_top, self.bottom = top + 34, top + 34 + height
        self.group = (right - left) / n
        self.bar = int(max(8, min(56, self.group * 0.55)))

    def center(self, i: int) -> int:
        return int(self.left + self.group * (i + 0.5))

    def header(self, title: str, legend: list[tuple[str, object]]) -> None:
        """The panel's title (scale 2) on the left, legend entries (label, swatch) on the right."""
        cv, y = self.cv, self.plot_top - 34
        cv.text(14, y, title, INK, 2)
        x = self.right - sum(16 + text_width(label) + 14 for label, _ in legend) + 14
        for label, swatch in legend:
            swatch(x + 5, y + 7)
            cv.text(x + 16, y + 4, label, INK)
            x += 16 + text_width(label) + 14

    def axis(self, vmax: float, title: str, side: str = "left", color=MUTED, grid: bool = True):
        """Ticks and numbers on one side; returns value -> y."""
        ticks, decimals = nice_axis(vmax)
        top = ticks[-1]
        cv, height = self.cv, self.bottom - self.plot_top

        def y_of(v: float) -> int:
            return self.bottom - int(round(v / top * height))

        for v in ticks:
            y, label = y_of(v), f"{v:.{decimals}f}"
            if grid and v > 0:
                cv.rect(self.left, y, self.right, y + 1, GRID)
            if side == "left":
                cv.rect(self.left - 4, y, self.left, y + 1, AXIS)
                cv.text(self.left - 7 - text_width(label), y - 3, label, color)
            else:
                cv.rect(self.right, y, self.right + 4, y + 1, AXIS)
                cv.text(self.right + 7, y - 3, label, color)
        x = self.left if side == "left" else self.right
        cv.rect(x, self.plot_top, x + 1, self.bottom + 1, AXIS)
        tx = self.left - 4 if side == "left" else self.right + 4 - text_width(title)
        cv.text(tx, self.plot_top - 13, title, color)
        return y_of

    def bars(self, values: list[float], colors: list[tuple], y_of) -> list[tuple[int, ...]]:
        """One bar a group from 0 to each value; returns their (x0, y0, x1, y1) boxes."""
        boxes = []
        for i, (v, color) in enumerate(zip(values, colors)):
            x0 = self.center(i) - self.bar // 2
            boxes.append((x0, y_of(v), x0 + self.bar, self.bottom))
            self.cv.rect(*boxes[-1], color)
        return boxes

    def labels(self, names: list[str], values: list[list[tuple[str, tuple]]]) -> None:
        """Config names under the axis (on two staggered lines if they do not fit), then values."""
        cv = self.cv
        cv.rect(self.left, self.bottom, self.right + 1, self.bottom + 1, AXIS)
        room = int(self.group) - 4
        stagger = any(text_width(n) > room for n in names)
        for i, name in enumerate(names):
            label = fit(name, 2 * room - 4 if stagger else room)
            y = self.bottom + 5 + (LINE + 2) * (i % 2 if stagger else 0)
            cv.text(self.center(i) - text_width(label) // 2, y, label, INK)
        y = self.bottom + 5 + (LINE + 2) * (2 if stagger else 1)
        for i, parts in enumerate(values):
            if sum(text_width(p) + ADVANCE for p, _ in parts) > room + ADVANCE:
                parts = parts[:1]
            x = self.center(i) - (sum(text_width(p) + ADVANCE for p, _ in parts) - ADVANCE) // 2
            for part, color in parts:
                cv.text(x, y, part, color)
                x += text_width(part) + ADVANCE


def render(bench: dict, title: str = "") -> tuple[bytes, dict]:
    """The PNG bytes and the layout: each panel's bars as (name, x0, y0, x1, y1) pixel boxes."""
    cv = Canvas(WIDTH, HEIGHT)
    rows, n = bench["configs"], len(bench["configs"])
    names = [r["name"] for r in rows]

    # Title line: the run's title, then device, batch, prompts, max_new_tokens: all at scale 2 if
    # that fits, else the facts at scale 1 on the same baseline, else all at scale 1 (cut).
    head = f"{title}: " if title else "specdec bench: "
    facts = (f"device {bench['device']}, batch {bench['batch']}, {bench['prompts']} prompts, "
             f"max_new_tokens {bench['max_new_tokens']}")
    room = WIDTH - 28
    if text_width(head + facts, 2) <= room:
        cv.text(14, 10, head + facts, INK, 2)
    elif text_width(head, 2) + 8 + text_width(facts) <= room:
        cv.text(14, 10, head, INK, 2)
        cv.text(14 + text_width(head, 2) + 8, 17, facts, INK)
    else:
        cv.text(14, 17, fit(head + facts, room), INK)
    detail = (f"model {short_path(bench['model'])}   draft {short_path(bench['draft'])}   "
              f"NONE decode {bench['base_decode_tokens_per_s']:.1f} tok/s")
    if bench["choice"] is not None:
        by_name = {r["name"]: r for r in rows}
        best = by_name[bench["measured_best"]]["speedup"]
        ratio = by_name[bench["choice"]]["speedup"] / best if best > 0 else 0.0
        detail += (f"   advisor: {bench['choice']} = {100 * ratio:.1f}% of measured best"
                   f" ({bench['measured_best']})")
    cv.text(14, 32, fit(detail, WIDTH - 28), MUTED)

    def square(color):
        return lambda x, y: cv.rect(x - 5, y - 5, x + 6, y + 6, color)

    # Panel 1: speedup; bars measured (the advisor's choice in orange), diamonds predicted.
    p = Panel(cv, 52, 170, 56, WIDTH - 56, n)
    predicted = [r["predicted_speedup"] if r["algorithm"] != "NONE" else None for r in rows]
    vmax = max([1.0] + [r["speedup"] for r in rows] + [v for v in predicted if v is not None])
    y_of = p.axis(vmax * 1.12, "speedup vs NONE (x)")
    speedup_bars = p.bars([r["speedup"] for r in rows],
                          [CHOICE if r["name"] == bench["choice"] else BAR for r in rows], y_of)
    cv.dashed_hline(p.left + 1, p.right, y_of(1.0), BASELINE)
    for i, r in enumerate(rows):
        if predicted[i] is not None:
            cv.diamond(p.center(i), y_of(predicted[i]), 6, WHITE)
            cv.diamond(p.center(i), y_of(predicted[i]), 4, PREDICTED)
        if r["name"] == bench["measured_best"]:
            cv.triangle_down(p.center(i), p.plot_top - 2, 7, BEST)
    legend = [("measured", square(BAR))]
    if bench["choice"] is not None:
        legend.append(("advisor's choice", square(CHOICE)))
    if any(v is not None for v in predicted):
        legend.append(("advisor's prediction", lambda x, y: cv.diamond(x, y, 4, PREDICTED)))
    legend += [("measured best", lambda x, y: cv.triangle_down(x, y - 3, 7, BEST)),
               ("1.0 = NONE", lambda x, y: cv.dashed_hline(x - 6, x + 7, y, BASELINE, 4, 2))]
    p.header("Speedup", legend)
    p.labels(names, [[(f"{r['speedup']:.2f}x", INK)] for r in rows])

    # Panel 2: accept length (bars, left axis) and efficiency (dots, right axis).
    p = Panel(cv, 302, 170, 56, WIDTH - 56, n)
    y_of = p.axis(max([1.0] + [r["accept_length"] for r in rows]) * 1.08, "accept length")
    e_of = p.axis(max([1.0] + [r["efficiency"] for r in rows]) * 1.08, "efficiency",
                  side="right", color=EFFICIENCY, grid=False)
    accept_bars = p.bars([r["accept_length"] for r in rows], [ACCEPT] * n, y_of)
    for i, r in enumerate(rows):
        cv.disc(p.center(i), e_of(r["efficiency"]), 6, WHITE)
        cv.disc(p.center(i), e_of(r["efficiency"]), 4, EFFICIENCY)
    p.header("Accept length, efficiency", [
        ("accept length (tokens/verify)", square(ACCEPT)),
        ("efficiency = speedup / accept length", lambda x, y: cv.disc(x, y, 4, EFFICIENCY))])
    p.labels(names, [[(f"{r['accept_length']:.2f}", ACCEPT), (f"{r['efficiency']:.2f}", EFFICIENCY)]
                     for r in rows])
    layout = {"speedup_bars": [(nm, *b) for nm, b in zip(names, speedup_bars)],
              "accept_bars": [(nm, *b) for nm, b in zip(names, accept_bars)]}
    return cv.png(), layout


# ---------------------------------------------------------------------------------------------
# Self-test (ctest demo.bench_plot)

SAMPLE = {
    "model_path": "models/demo/target", "draft_path": "models/demo/eagle3", "device": "cpu",
    "batch": 1, "prompts": 16, "max_new_tokens": 96,
    "configs": [
        {"name": "NONE", "algorithm": "NONE", "decode_tokens_per_s": 812.5, "speedup": 1.0,
         "accept_length": 1.0, "efficiency": 1.0, "predicted_decode_tokens_per_s": 812.5},
        {"name": "chain 1", "algorithm": "EAGLE3", "decode_tokens_per_s": 1105.0, "speedup": 1.36,
         "accept_length": 1.71, "efficiency": 0.795, "predicted_decode_tokens_per_s": 1080.6},
        {"name": "chain 3", "algorithm": "EAGLE3", "decode_tokens_per_s": 1430.0, "speedup": 1.76,
         "accept_length": 2.62, "efficiency": 0.672, "predicted_decode_tokens_per_s": 1393.4},
        {"name": "chain 5", "algorithm": "EAGLE3", "decode_tokens_per_s": 1365.0, "speedup": 1.68,
         "accept_length": 3.05, "efficiency": 0.551, "predicted_decode_tokens_per_s": 1450.2},
        {"name": "tree 4x3/8", "algorithm": "EAGLE3", "decode_tokens_per_s": 1495.0,
         "speedup": 1.84, "accept_length": 3.12, "efficiency": 0.590,
         "predicted_decode_tokens_per_s": 1370.0},
        {"name": "tree 8x4/16", "algorithm": "EAGLE3", "decode_tokens_per_s": 658.0,
         "speedup": 0.81, "accept_length": 3.41, "efficiency": 0.238,
         "predicted_decode_tokens_per_s": 900.0}],
    "advisor": {"choice": "chain 3", "measured_best": "tree 4x3/8", "choice_vs_best": 0.957,
                "choice_within_5_percent": True}}


def read_png(data: bytes) -> tuple[int, int, bytes]:
    """Width, height and RGB rows of an 8-bit RGB PNG whose rows all use filter 0 (ours)."""
    if data[:8] != b"\x89PNG\r\n\x1a\n":
        raise ValueError("no PNG signature")
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos:pos + 4])
        kind, body = data[pos + 4:pos + 8], data[pos + 8:pos + 8 + length]
        (crc,) = struct.unpack(">I", data[pos + 8 + length:pos + 12 + length])
        if zlib.crc32(kind + body) & 0xFFFFFFFF != crc:
            raise ValueError(f"bad CRC in chunk {kind!r}")
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
        if kind == b"IEND":
            break
    if header is None or header[2:] != (8, 2, 0, 0, 0) or pos != len(data):
        raise ValueError(f"unexpected header {header} or data after IEND")
    width, height = header[0], header[1]
    raw, stride = zlib.decompress(idat), width * 3 + 1
    if len(raw) != stride * height:
        raise ValueError(f"{len(raw)} bytes of pixel data for {width}x{height}")
    if any(raw[y * stride] != 0 for y in range(height)):
        raise ValueError("a row with a filter other than 0")
    return width, height, b"".join(raw[y * stride + 1:(y + 1) * stride] for y in range(height))


def self_test(keep: str | None) -> int:
    failures: list[str] = []

    def check(ok: bool, what: str) -> None:
        print(("ok   " if ok else "FAIL ") + what)
        if not ok:
            failures.append(what)

    bench = load_bench(json.dumps(SAMPLE))
    png, layout = render(bench, "self-test")
    check(render(load_bench(json.dumps(SAMPLE)), "self-test")[0] == png, "same JSON, same bytes")
    width, height, rgb = read_png(png)  # raises on a broken chunk, CRC, zlib stream or filter
    check((width, height) == (WIDTH, HEIGHT), f"size {width}x{height}")
    check(rgb.count(255) < len(rgb) * 0.98, "not (nearly) all white")

    def column(x: int, colors) -> int:  # pixels of the given colours in column x
        wanted = {bytes(c) for c in colors}
        return sum(rgb[3 * (y * width + x):3 * (y * width + x) + 3] in wanted
                   for y in range(height))

    for key, colors in (("speedup_bars", (BAR, CHOICE)), ("accept_bars", (ACCEPT,))):
        for name, x0, y0, x1, y1 in layout[key]:
            got = column(x0 + 1, colors)
            check(abs(got - (y1 - y0)) <= 2, f"{key} {name}: {got} bar pixels, drawn {y1 - y0}")
    heights = {name: column(x0 + 1, (BAR, CHOICE)) for name, x0, _, _, _ in layout["speedup_bars"]}
    speed = {c["name"]: c["speedup"] for c in SAMPLE["configs"]}
    top, low = max(speed, key=speed.get), min(speed, key=speed.get)
    check(heights[top] > heights[low] + 50, f"bar of {top} ({heights[top]} px) taller than {low} "
          f"({heights[low]} px)")
    unit = heights["NONE"] / speed["NONE"]
    off = [n for n in speed if abs(heights[n] - speed[n] * unit) > 2]
    check(not off, f"bar heights proportional to the speedups (off: {off})")
    choice = {name: column(x0 + 1, (CHOICE,)) > 0 for name, x0, _, _, _ in layout["speedup_bars"]}
    check([n for n, orange in choice.items() if orange] == ["chain 3"], "only the choice in orange")

    def variant(edit) -> str:
        doc = json.loads(json.dumps(SAMPLE))
        edit(doc)
        return json.dumps(doc)

    # A sweep at several batch sizes: the run at --batch (default the first) is plotted.
    other = json.loads(json.dumps(SAMPLE))
    other["batch"] = SAMPLE["batch"] + 3
    other["configs"][1]["speedup"] = 0.5
    sweep = json.dumps({"batches": [SAMPLE, other], "draft_steps_plan": {}})
    check(load_bench(sweep) == bench, "a sweep of several batch sizes: the first by default")
    check(load_bench(sweep, other["batch"]) == load_bench(json.dumps(other)),
          "a sweep of several batch sizes: the one at --batch")
    for text, batch, expected in ((sweep, 999, "no run at batch 999"),
                                  (json.dumps({"batches": []}), None, '"batches"'),
                                  (json.dumps(SAMPLE), 999, "no run at batch 999")):
        try:
            load_bench(text, batch)
            check(False, f"refuses expecting {expected}")
        except BenchError as e:
            check(expected in str(e), f"refuses: {e}")

    bad = [("{not json", "not JSON"), ("[1, 2]", "not a JSON object"),
           (variant(lambda d: d.pop("configs")), '"configs"'),
           (variant(lambda d: d.update(configs=[])), '"configs"'),
           (variant(lambda d: d["configs"].reverse()), "NONE baseline"),
           (variant(lambda d: d["configs"][2].update(speedup="fast")), '"speedup"'),
           (variant(lambda d: d["configs"][1].update(accept_length=True)), '"accept_length"'),
           (variant(lambda d: d["configs"][3].pop("efficiency")), '"efficiency"'),
           (variant(lambda d: d.update(batch="one")), '"batch"'),
           (json.dumps(SAMPLE).replace("1.36", "NaN"), '"speedup"'),
           (variant(lambda d: d["advisor"].update(choice="chain 9")), "names no config")]
    for text, expected in bad:
        try:
            load_bench(text)
            check(False, f"refuses input expecting {expected}")
        except BenchError as e:
            check(expected in str(e), f"refuses: {e}")

    with tempfile.TemporaryDirectory() as tmp:  # the command line: exit 0 / exit 2
        good, wrong, out = (os.path.join(tmp, n) for n in ("good.json", "bad.json", "out.png"))
        with open(good, "w") as f:
            json.dump(SAMPLE, f)
        with open(wrong, "w") as f:
            f.write(bad[4][0])
        cmd = [sys.executable, os.path.abspath(__file__)]
        run = subprocess.run(cmd + [good, "--out", out, "--title", "self-test"],
                             capture_output=True)
        with open(out, "rb") as f:
            check(run.returncode == 0 and f.read() == png, "command line writes the same PNG")
        run = subprocess.run(cmd + [wrong, "--out", out], capture_output=True, text=True)
        check(run.returncode == 2 and "NONE baseline" in run.stderr,
              f"command line refuses bad JSON with exit 2: {run.returncode} {run.stderr.strip()}")
    if keep:
        with open(keep, "wb") as f:
            f.write(png)
    print(f"{len(failures)} failure(s)" if failures else "all checks passed")
    return 1 if failures else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("json", nargs="?", help="the file of specdec-kimi bench --json")
    ap.add_argument("--out", help="the PNG to write (with --self-test: keep the sample there)")
    ap.add_argument("--title", default="", help="text to start the title line with")
    ap.add_argument("--batch", type=int, help="the batch size to plot (a sweep of several)")
    ap.add_argument("--self-test", action="store_true", help="check the renderer (ctest)")
    args = ap.parse_args()
    if args.self_test:
        return self_test(args.out)
    if not args.json or not args.out:
        ap.error("FILE.json and --out PLOT.png are needed")
    try:
        with open(args.json, encoding="utf-8") as f:
            text = f.read()
    except (OSError, UnicodeDecodeError) as e:
        print(f"bench_plot.py: cannot read {args.json}: {e}", file=sys.stderr)
        return 2
    try:
        png, _ = render(load_bench(text, args.batch), args.title)
    except BenchError as e:
        print(f"bench_plot.py: {args.json}: {e}", file=sys.stderr)
        return 2
    with open(args.out, "wb") as f:
        f.write(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
