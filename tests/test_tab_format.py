"""The Attention tab's format, written once in Python: the per-head scalars' tag names, read back
by the same module that writes them, and the constants the page is handed by the settings route
(attention_tab/page_settings.py) rather than writing its own copy."""

from pathlib import Path

from attention_tab.page_settings import MIN_LINE_WEIGHT, TOKEN_ROW_PX, page_settings
from inspection.heatmap import COLORMAP, FUTURE
from inspection.tab_format import REPEATED_N, TAB_METRICS, head_scalar_of, head_scalar_parts, head_scalar_tag


def test_the_page_writes_down_none_of_the_constants_the_settings_route_sends():
    static = Path(__file__).parent.parent / "attention_tab" / "static"
    page = {path.name: path.read_text() for path in [*static.glob("*.js"), static / "style.css"]}
    copies = [", ".join(map(str, COLORMAP[0])), ", ".join(map(str, FUTURE)), *(f'"{m.label}"' for m in TAB_METRICS.values()),
              *(m.meaning for m in TAB_METRICS.values()), f"--row: {TOKEN_ROW_PX}px", f"= {TOKEN_ROW_PX};",
              f"= {MIN_LINE_WEIGHT};", f'"{REPEATED_N}"', f"empty: {REPEATED_N}"]
    found = [(name, copy) for name, text in page.items() for copy in copies if copy in text]
    assert found == []


def test_a_per_head_tag_reads_back_as_its_metric_layer_and_head():
    for metric, tab_metric in TAB_METRICS.items():
        assert head_scalar_of(head_scalar_tag(tab_metric.prefix, 3, 11)) == (metric, 3, 11)
    assert head_scalar_of("ablation/induction_loss/layer_0/head_1") is None  # logged, not a metric the tab shows
    assert head_scalar_of("head_induction/layer_0/head_1/x") is None


def test_a_tag_with_any_prefix_reads_back_as_its_prefix_layer_and_head():
    assert head_scalar_parts(head_scalar_tag("ablation/induction_loss", 1, 0)) == ("ablation/induction_loss", 1, 0)
    assert head_scalar_parts("ablation/induction_loss/intact") is None


def test_the_settings_hold_the_heatmaps_colours_and_the_metrics_in_the_head_tables_order():
    settings = page_settings()
    assert settings["colormap"] == COLORMAP.tolist() and settings["future"] == list(FUTURE)
    assert list(settings["metrics"]) == list(TAB_METRICS)
    assert all(metric in TAB_METRICS for metric in settings["badge_metrics"])
