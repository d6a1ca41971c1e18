"""`python train.py debug=shapes`: every tensor's shape through one forward of your model.

The trace watches the real forward pass, so it cannot disagree with the code: a
TorchFunctionMode sees each torch operation as it runs, and the trace prints the line of
model/ that asked for it (with its shape comment), followed by the shapes that line actually
produced, in numbers, step by step: `q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)`
shows the three (B, H, T, D) and (B, K, T, D) it made. A function on every hook_pattern (model/hooks.py)
makes attention run its "manual" path here, so the steps the fused sdpa call hides (scores, mask,
softmax, weights @ V) are shown one by one. The first block is shown in
full; the later ones repeat it exactly, and are summarised.

    trace_shapes(model, idx, targets) -> list of lines to print
"""

import linecache
import sys
from pathlib import Path
from types import FrameType

import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from model import GPT, eval_mode
from model.hooks import is_pattern
from model.norms import GainDtypeRMSNorm, NormHooks

MODEL_DIR = Path(__file__).resolve().parent.parent / "model"
NORMS = (NormHooks, GainDtypeRMSNorm)  # model/'s norms: the trace shows the line that called one, not its insides
NORM_CODE = {norm.forward.__code__ for norm in NORMS}


def shape_of(value: object) -> str | None:
    if isinstance(value, torch.Tensor):
        return str(tuple(value.shape))
    if isinstance(value, (tuple, list)) and value and all(isinstance(v, torch.Tensor) for v in value):
        shapes = {tuple(v.shape) for v in value}
        return f"{len(value)} x {shapes.pop()}" if len(shapes) == 1 else ", ".join(str(tuple(v.shape)) for v in value)
    return None


def lesson_frame() -> FrameType | None:
    """The innermost frame running code from model/ (the line that asked for the operation), not
    counting a norm's own forward (the line that called the norm is the one to show)."""
    frame = sys._getframe(2)
    while frame is not None:
        if Path(frame.f_code.co_filename).resolve().parent == MODEL_DIR and frame.f_code not in NORM_CODE:
            return frame
        frame = frame.f_back
    return None


class LineShapes(TorchFunctionMode):
    """Records, per line of model/ code, the shapes of the tensors that line produced, in order
    (a shape the line's previous operation already had is not repeated)."""

    def __init__(self) -> None:
        super().__init__()
        self.steps: list[tuple[str, str, int, list[str]]] = []  # (module, file, line, shapes)
        self.modules: list[str] = ["(model)"]

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        shape = shape_of(out)
        frame = lesson_frame()
        if shape is not None and frame is not None:
            where = (self.modules[-1], frame.f_code.co_filename, frame.f_lineno)
            if not self.steps or self.steps[-1][:3] != where:
                self.steps.append((*where, [shape]))
            elif self.steps[-1][3][-1] != shape:
                self.steps[-1][3].append(shape)  # the next step of the same line
        return out


@torch.no_grad()
def trace_shapes(model: GPT, idx: torch.Tensor, targets: torch.Tensor) -> list[str]:
    """One forward of model on idx (B, T) and targets (B, T); returns the trace as lines."""
    c = model.config
    B, T = idx.shape
    recorder = LineShapes()
    # Steps are filed under the innermost module of model/ running them (GPT, Block, MLP,
    # CausalSelfAttention), not under the torch layers (Linear, LayerNorm) they call.
    names = {module: name or "GPT" for name, module in model.named_modules()
             if type(module).__module__.startswith("model.") and not isinstance(module, NORMS)}
    def enter(module: nn.Module, args: tuple) -> None:
        recorder.modules.append(names[module])

    def leave(module: nn.Module, args: tuple, out: object) -> None:  # returns None: the output stays as it is
        recorder.modules.pop()

    hooks = []
    for module in names:
        hooks += [module.register_forward_pre_hook(enter), module.register_forward_hook(leave)]
    look_at_patterns = [(is_pattern, lambda pattern, hook: None)]  # reads nothing
    try:
        with eval_mode(model), model.hooks(look_at_patterns), recorder:
            model(idx, targets)
    finally:
        for hook in hooks:
            hook.remove()

    lines = [
        f"One forward of the configured model ({model.num_parameters() / 1e6:.2f}M parameters, "
        f"attention path {c.attention!r}, traced through 'manual' to show every step):",
        f"  B={B} sequences, T={T} tokens, C={c.n_embd} channels, H={c.n_head} heads of D={c.head_size} dims"
        + (f" sharing K={c.kv_heads} key/value heads" if c.kv_heads != c.n_head else "")
        + f", {c.n_layer} block{'s' if c.n_layer != 1 else ''}, vocab {c.vocab_size}",
        "",
    ]
    shown_module, summarised = None, False
    for module, filename, lineno, shapes in recorder.steps:
        if any(module == f"blocks.{i}" or module.startswith(f"blocks.{i}.") for i in range(1, c.n_layer)):
            if not summarised:  # the later blocks repeat blocks.0 exactly
                later = "blocks.1" if c.n_layer == 2 else f"blocks.1 to blocks.{c.n_layer - 1}"
                lines.append(f"{later}: the same steps and shapes as blocks.0")
                shown_module, summarised = None, True
            continue
        if module != shown_module:
            kind = type(model.get_submodule("" if module == "GPT" else module)).__name__
            lines.append(f"{module} ({kind})")
            shown_module = module
        code = linecache.getline(filename, lineno).strip()
        lines.append(f"  {Path(filename).name}:{lineno:<4} {code}")
        lines.append(f"  {'':>{len(Path(filename).name) + 5}} -> {' -> '.join(shapes)}")
    return lines
