"""What the docs' pictures share: the width they are shown at, fonts, and a line plot drawn
with Pillow, like the heatmaps (inspection/heatmap.py), so that every picture comes from the
same few lines of drawing code and the same font, and a test can redraw it pixel for pixel."""

import math
from dataclasses import dataclass, field
from functools import lru_cache

import numpy as np
import PIL
from PIL import Image, ImageDraw, ImageFont, features

from inspection.heatmap import FONT_FILES, INK

# GitHub shows a README's or a page's pictures at most about this wide (its text column); a
# picture no wider is shown at its own size, so an 11 px label is 11 px on the screen.
SHOWN_WIDTH = 830
MIN_LABEL_PX = 11
GRID, FAINT = (225, 225, 225), (120, 120, 120)
BLUE, ORANGE, RED = (31, 119, 180), (255, 127, 14), (214, 39, 40)


@lru_cache(maxsize=4)
def font(size: int = MIN_LABEL_PX) -> ImageFont.FreeTypeFont | ImageFont.ImageFont:
    for name in FONT_FILES:
        try:
            return ImageFont.truetype(name, size)
        except OSError:
            continue
    return ImageFont.load_default(size=size)


def drawn_with() -> dict[str, str]:
    """What decides the pixels besides the drawing code: the same values draw the same PNG."""
    face = font()
    return {"pillow": PIL.__version__, "freetype": str(features.version("freetype2")),
            "font": " ".join(face.getname()) if isinstance(face, ImageFont.FreeTypeFont) else "Pillow's default"}


def one_above_another(images: list[Image.Image], gap: int = 8) -> Image.Image:
    """Images top to bottom, left-aligned, on white."""
    canvas = Image.new("RGB", (max(image.width for image in images), sum(image.height for image in images)
                               + gap * (len(images) - 1)), "white")
    y = 0
    for image in images:
        canvas.paste(image, (0, y))
        y += image.height + gap
    return canvas


def side_by_side(images: list[Image.Image | np.ndarray], gap: int = 8) -> Image.Image:
    """Images left to right, top-aligned, on white."""
    images = [image if isinstance(image, Image.Image) else Image.fromarray(image) for image in images]
    width = sum(image.width for image in images) + gap * (len(images) - 1)
    canvas = Image.new("RGB", (width, max(image.height for image in images)), "white")
    x = 0
    for image in images:
        canvas.paste(image, (x, 0))
        x += image.width + gap
    return canvas


@dataclass
class Line:
    label: str
    xs: list[float]
    ys: list[float | None]  # None (or NaN): no point there, the line breaks
    colour: tuple[int, int, int]
    width: int = 2
    dashed: bool = False


@dataclass
class Plot:
    """One panel: lines on linear or log10 x and y axes, with ticks, a legend, shaded x bands
    and labelled vertical lines."""

    title: str
    x_label: str
    y_label: str
    x_range: tuple[float, float]  # in data units (log_x: the values at the ends)
    y_range: tuple[float, float]  # in data units (log_y: the powers of 10 at the ends)
    x_ticks: list[float]
    y_ticks: list[float]
    lines: list[Line]
    log_y: bool = False
    log_x: bool = False
    bands: list[tuple[float, float, str]] = field(default_factory=list)  # (x0, x1, label): shaded
    marks: list[tuple[float, str]] = field(default_factory=list)  # (x, label): a dashed vertical line
    points: list[tuple[float, float, str]] = field(default_factory=list)  # (x, y, label): a dot
    legend: tuple[float, float] | None = None  # where the legend starts, in data units (None: top left)

    def draw(self, width: int, height: int) -> Image.Image:
        face = font()
        image = Image.new("RGB", (width, height), "white")
        draw = ImageDraw.Draw(image)
        left, right, top, bottom = 64, width - 16, 30, height - 44
        x0, x1 = (math.log10(v) for v in self.x_range) if self.log_x else self.x_range
        y0, y1 = (math.log10(v) for v in self.y_range) if self.log_y else self.y_range

        def px(x: float) -> float:
            x = math.log10(x) if self.log_x else x
            return left + (x - x0) / (x1 - x0) * (right - left)

        def py(y: float) -> float:
            y = math.log10(y) if self.log_y else y
            return bottom - (y - y0) / (y1 - y0) * (bottom - top)

        draw.text((left, 8), self.title, font=face, fill=INK)
        for start, end, label in self.bands:
            draw.rectangle([px(start), top, px(end), bottom], fill=(253, 232, 232))
            draw.text((px(start) + 6, top + 6), label, font=face, fill=RED)
        for x in self.x_ticks:
            draw.line([(px(x), top), (px(x), bottom)], fill=GRID)
            draw.text((px(x), bottom + 4), f"{x:g}", font=face, fill=INK, anchor="mt")
        for y in self.y_ticks:
            draw.line([(left, py(y)), (right, py(y))], fill=GRID)
            draw.text((left - 6, py(y)), f"{y:g}", font=face, fill=INK, anchor="rm")
        draw.rectangle([left, top, right, bottom], outline=INK)
        draw.text(((left + right) / 2, height - 6), self.x_label, font=face, fill=INK, anchor="mb")
        label = Image.new("RGB", (bottom - top, 14), "white")
        ImageDraw.Draw(label).text(((bottom - top) / 2, 7), self.y_label, font=face, fill=INK, anchor="mm")
        image.paste(label.rotate(90, expand=True), (4, top))
        for x, text in self.marks:
            for y in range(int(top), int(bottom), 8):
                draw.line([(px(x), y), (px(x), y + 4)], fill=FAINT)
            draw.text((px(x) - 4, bottom - 6), text, font=face, fill=FAINT, anchor="rb")
        for line in self.lines:
            run: list[tuple[float, float]] = []
            for x, y in [*zip(line.xs, line.ys, strict=True), (None, None)]:
                if y is None or not math.isfinite(y):
                    self._stroke(draw, run, line)
                    run = []
                else:
                    run.append((px(x), py(y)))
        for x, y, text in self.points:
            draw.ellipse([px(x) - 4, py(y) - 4, px(x) + 4, py(y) + 4], fill=INK)
            draw.text((px(x) - 8, py(y) + 8), text, font=face, fill=INK, anchor="ra")
        legend_x, legend_y = (px(self.legend[0]), py(self.legend[1])) if self.legend else (left + 10, top + 12)
        for i, line in enumerate([line for line in self.lines if line.label]):  # a line without a label stays out
            y = legend_y + 18 * i
            draw.line([(legend_x, y), (legend_x + 24, y)], fill=line.colour, width=line.width)
            draw.text((legend_x + 30, y), line.label, font=face, fill=INK, anchor="lm")
        return image

    @staticmethod
    def _stroke(draw: ImageDraw.ImageDraw, points: list[tuple[float, float]], line: Line) -> None:
        if len(points) < 2:
            return
        if not line.dashed:
            draw.line(points, fill=line.colour, width=line.width, joint="curve")
            return
        for i, (a, b) in enumerate(zip(points, points[1:], strict=False)):
            if i % 2 == 0:
                draw.line([a, b], fill=line.colour, width=line.width)
