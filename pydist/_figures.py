"""Pictures that stay legible where a docs page shows them.

A page shows a picture at its column's width, COLUMN_PX CSS pixels in a laptop's 1280 px window (or at
its own width when narrower), so a label's size on the page is its size in the PNG times COLUMN_PX /
the PNG's width. A figure WIDTH_IN wide saved at DPI is twice the column's pixels (sharp on a
high-density screen), and there a text of s points shows s / 72 * COLUMN_PX / WIDTH_IN = 1.39 s px:
MIN_PT (8 points) is MIN_PAGE_PX (11 px; the body text is 16).

save() writes the PNG with its smallest text's height in the PNG's pixels recorded in a text chunk
(SMALLEST_KEY), which page_px() reads back with the PNG's width, and what problems() found in it
(PROBLEMS_KEY), which recorded_problems() reads back. problems() lists what a reader could
not read: text under MIN_PAGE_PX at the column, text cut off at the picture's edge, text drawn over
other text (a log axis's minor labels run into each other when it spans less than a decade).
"""
import types

COLUMN_PX = 736
DPI = 200
WIDTH_IN = 2 * COLUMN_PX / DPI
MIN_PAGE_PX = 11
MIN_PT = 8
SMALLEST_KEY = "Smallest text px"
PROBLEMS_KEY = "Text problems"


def drawn_texts(fig, dpi=DPI):
    """[(text, points, window extent)] of every line of text that drawing `fig` at `dpi` puts on it.

    Only what the renderer is asked to draw counts: tick labels of ticks outside the view, a hidden
    legend, an empty title are not there."""
    return _draw(fig, dpi)[0]


def _draw(fig, dpi):
    """Draw `fig` at `dpi` once: (drawn_texts' list, the Agg renderer holding the picture)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    fig.set_dpi(dpi)
    renderer = FigureCanvasAgg(fig).get_renderer()
    found = []

    def spy(draw):
        def draw_text(self, gc, x, y, s, prop, angle, ismath=False, mtext=None):
            if s.strip():
                box = mtext.get_window_extent(renderer) if mtext is not None else None
                found.append((s, prop.get_size_in_points(), box))
            return draw(gc, x, y, s, prop, angle, ismath, mtext)
        return types.MethodType(draw_text, renderer)

    renderer.draw_text = spy(renderer.draw_text)
    fig.draw(renderer)
    return found, renderer


def problems(fig, dpi=DPI):
    """What a reader of the docs could not read in `fig` saved at `dpi`, one line each."""
    return _problems(fig, dpi, drawn_texts(fig, dpi))


def _problems(fig, dpi, texts):
    width_px, height_px = fig.get_figwidth() * dpi, fig.get_figheight() * dpi
    scale = min(1.0, COLUMN_PX / width_px)
    found, seen = [], set()
    for i, (text, points, box) in enumerate(texts):
        page = points / 72 * dpi * scale
        if page < MIN_PAGE_PX - 0.05 and (text, "small") not in seen:
            seen.add((text, "small"))
            found.append(f"{text!r}: {page:.1f} px on the page (at least {MIN_PAGE_PX})")
        if box is not None and (box.x0 < -1 or box.y0 < -1 or box.x1 > width_px + 1 or box.y1 > height_px + 1) \
                and (text, "cut") not in seen:
            seen.add((text, "cut"))
            found.append(f"{text!r}: cut off at the picture's edge")
        for other, _, other_box in texts[i + 1:]:
            if box is not None and other_box is not None and _overlap(box, other_box) \
                    and (text, other, "over") not in seen:
                seen.add((text, other, "over"))
                found.append(f"{text!r} and {other!r}: drawn over each other")
    return found


def _overlap(a, b, margin=1.0):
    """Whether two texts' boxes share more than `margin` px each way (touching is not overlapping)."""
    return min(a.x1, b.x1) - max(a.x0, b.x0) > margin and min(a.y1, b.y1) - max(a.y0, b.y0) > margin


def save(fig, path, dpi=DPI):
    """Write `fig` to the PNG `path` at `dpi`, its smallest text and its problems() recorded for the
    docs' check; returns the problems. The picture is drawn once: the drawing that measures the text is
    the one written."""
    import matplotlib.image
    import numpy as np

    texts, renderer = _draw(fig, dpi)
    smallest = min((points for _, points, _ in texts), default=0) / 72 * dpi
    found = _problems(fig, dpi, texts)
    matplotlib.image.imsave(path, np.asarray(renderer.buffer_rgba()), format="png", dpi=dpi,
                            metadata={SMALLEST_KEY: f"{smallest:.1f}", PROBLEMS_KEY: "\n".join(found)})
    return found


def page_px(path, column_px=COLUMN_PX):
    """The smallest text of the PNG `path` in CSS px where a page column of `column_px` shows it, or
    None when save() did not write it."""
    from PIL import Image

    with Image.open(path) as image:
        recorded = image.text.get(SMALLEST_KEY)
        width = image.width
    if recorded is None:
        return None
    return float(recorded) * min(1.0, column_px / width)


def recorded_problems(path):
    """The problems() save() found in the PNG `path` ([] for none), or None when save() did not write it."""
    from PIL import Image

    with Image.open(path) as image:
        recorded = image.text.get(PROBLEMS_KEY)
    return None if recorded is None else [line for line in recorded.split("\n") if line]
