"""The Attention tab: a TensorBoard plugin that shows every head's attention on the probe text,
at every logged step. summary.py is what a run writes for it, plugin.py what TensorBoard serves,
static/ the page the tab loads (plain ES modules, no build step)."""
