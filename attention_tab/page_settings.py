"""What the page is told once, at load (the settings route): every constant that the page and
Python would otherwise each write down, so that a change here reaches both."""

from inspection.heatmap import COLORMAP, FUTURE
from inspection.tab_format import REPEATED_N, TAB_METRICS

TOKEN_ROW_PX = 18  # a token's row in the token view: its button's height (CSS var(--row)) and its lines' ends
MIN_LINE_WEIGHT = 0.01  # the token view leaves out lighter lines, they only blur the picture
BADGE_METRICS = ("recall", "induction")  # the model view prints on each head the first of these the run logged


def page_settings() -> dict:
    """JSON:
        colormap         [256][3]: the heatmaps' levels (inspection/heatmap.py), level i for sqrt(weight) = i / 255
        future           [3]: the colour of a cell a query cannot see
        metrics          {name: [label, meaning]}: the head metrics the tab shows, in its columns' order
        token_row_px, min_line_weight, badge_metrics, repeated_n: as named above"""
    return {"colormap": COLORMAP.tolist(), "future": list(FUTURE),
            "metrics": {name: [metric.label, metric.meaning] for name, metric in TAB_METRICS.items()},
            "token_row_px": TOKEN_ROW_PX, "min_line_weight": MIN_LINE_WEIGHT, "badge_metrics": list(BADGE_METRICS),
            "repeated_n": REPEATED_N}
