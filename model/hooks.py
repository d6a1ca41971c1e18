"""Named points in the model's forward where a function may read or replace an activation,
and the cache that keeps what a forward passed through them.

The names are TransformerLens's (blocks.0.attn.hook_pattern, blocks.1.hook_resid_post, ...), so
a learner moving between the two finds the same activation under the same name; docs/hooks.md
lists them with their shapes. With no function attached, a hook point hands its input straight
back: the forward pays one attribute check per point.

    HookPoint        one named activation; GPT holds one per activation (model/gpt.py)
    HookedModel      what GPT gains from them: hook_dict, hooks(), run_with_hooks(), run_with_cache()
    ActivationCache  the activations of one forward by name, with cache["pattern", 0] and the stacks
"""

import difflib
import inspect
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

# fn(activation, hook) returns the activation to use from here on, or None to keep it.
HookFn = Callable[[torch.Tensor, "HookPoint"], torch.Tensor | None]
# Where to attach it: a hook point's name, or a test on names (every point it accepts).
Where = str | Callable[[str], bool]

# Parameter names keep GPT-2's and nanoGPT's (checkpoints and exports read them); hook names take
# TransformerLens's. This table is the one place where the two spellings meet.
TRANSFORMER_LENS_NAMES = {"ln_f": "ln_final", "ln_1": "ln1", "ln_2": "ln2"}


class HookPoint:
    """One named activation of the forward: the identity, unless functions are attached.

    A plain object, not an nn.Module: the forward reads it as an ordinary attribute and calls it
    as an ordinary method, so with nothing attached it costs one check, not a module call."""

    def __init__(self) -> None:
        self.name = ""  # set by name_hook_points, e.g. "blocks.0.attn.hook_q"
        self.fns: list[HookFn] = []

    def __call__(self, activation: torch.Tensor) -> torch.Tensor:
        if not self.fns:
            return activation
        if activation.requires_grad:
            # A function may edit its activation in place, as TransformerLens's often do. Under autograd it
            # edits a copy: the activation may be a view autograd will not let change (hook_q, a slice of
            # one split) or a tensor a backward reads (hook_pattern, softmax's output).
            activation = activation.clone()
        for fn in tuple(self.fns):
            replaced = fn(activation, self)
            if replaced is not None:
                if not isinstance(replaced, torch.Tensor) or replaced.shape != activation.shape:
                    got = f"shape {tuple(replaced.shape)}" if isinstance(replaced, torch.Tensor) else type(replaced).__name__
                    raise ValueError(f"the function at {self.name} returned {got}: it must return None or a tensor "
                                     f"of the activation's shape {tuple(activation.shape)}")
                # Under autocast the next layer casts what it reads, as it casts the activation itself.
                autocast = torch.is_autocast_enabled(activation.device.type) and replaced.is_floating_point()
                if replaced.device != activation.device or (replaced.dtype != activation.dtype and not autocast):
                    raise ValueError(f"the function at {self.name} returned a {replaced.dtype} tensor on "
                                     f"{replaced.device}: the model goes on with {activation.dtype} on "
                                     f"{activation.device}, so return .to(activation)")
                activation = replaced
        return activation

    def layer(self) -> int | None:
        """The block this point is in (blocks.<layer>. ...), or None outside the blocks."""
        match = re.match(r"blocks\.(\d+)\.", self.name)
        return int(match.group(1)) if match else None

    def add_hook(self, fn: HookFn) -> Callable[[], None]:
        """Attach fn; returns a function that detaches it again."""
        self.fns.append(check_hook_fn(fn, self.name))
        return lambda: self.fns.remove(fn) if fn in self.fns else None

    def __repr__(self) -> str:
        return f"HookPoint({self.name!r}, {len(self.fns)} attached)"


def hook_points_of(root: nn.Module) -> dict[str, HookPoint]:
    """Every HookPoint held by root or a module inside it, by its path from root."""
    found = {}
    for path, module in root.named_modules():
        for attribute, value in vars(module).items():
            if isinstance(value, HookPoint):
                found[f"{path}.{attribute}" if path else attribute] = value
    return found


def name_hook_points(root: nn.Module) -> None:
    """Name every HookPoint under root by its path from root, in TransformerLens's spelling."""
    for path, point in hook_points_of(root).items():
        point.name = ".".join(TRANSFORMER_LENS_NAMES.get(part, part) for part in path.split("."))


# TransformerLens's names that a model here lacks for a reason of its own, and where to look instead.
MISSING_FOR_A_REASON = {
    r"hook_pos_embed": "this model has no position embeddings: its positions are rotary (model.pos=rope), turning "
                       "the queries and keys inside attention, as blocks.<l>.attn.hook_rot_q and hook_rot_k show; "
                       "a model trained with model.pos=learned has hook_pos_embed",
    r"blocks\.\d+\.attn\.hook_rot_[qk]": "this model has neither rotary positions nor QK-norm (model.pos=learned, "
                                        "model.qk_norm=false): its queries and keys are hook_q and hook_k as used",
    r"blocks\.\d+\.(attn\.)?hook_result": "no forward here makes each head's output through W_O (the output projection "
                                       "is one matmul over all heads): cache.stack_head_results() computes it from hook_z",
    r"blocks\.\d+\.hook_[qkv]_input": "the heads' inputs are not split here: every head reads ln1's output (its "
                                     "hook_normalized times its gain, plus its bias if it has one); one head's own queries, keys and "
                                     "values are blocks.<l>.attn.hook_q, hook_k and hook_v at [:, :, head]",
    r"blocks\.\d+\.mlp\.hook_pre_linear": "this model's MLP is not gated (model.mlp is not swiglu): hook_pre and "
                                         "hook_post are its two points",
}


def pick(points: dict[str, HookPoint], where: Where) -> list[HookPoint]:
    """The points of `points` that a name or a test on names picks; ValueError for an unknown
    name, saying why this model lacks it or naming the near ones, and for a test that picks none."""
    if callable(where):
        if not can_take(where, "name"):
            raise TypeError(f"the test on names takes {parameters_of(where)}: it is called with one argument, a hook "
                            "point's name, and returns whether to pick it (a hook function goes in fwd_hooks)")
        picked = [point for name, point in points.items() if where(name)]
        if not picked:  # a misspelt ending ("attn.hook_Z"), whose hooks would run nowhere without a word
            example = next((name for name in points if name.endswith("attn.hook_z")), next(iter(points), ""))
            raise ValueError(f"the test on names picks none of this model's {len(points)} hook points; "
                             f"list(model.hook_dict) names them all, e.g. {example!r}")
        return picked
    if not isinstance(where, str):
        raise TypeError(f"{where!r} is a {type(where).__name__}: a hook point is named by a string, e.g. "
                        "'blocks.0.attn.hook_pattern', or picked by a function of names")
    if where not in points:
        ending = f"hook_{SHORT_NAMES.get(where, where).removeprefix('hook_')}"
        if any(name.endswith(f".{ending}") for name in points):  # a short name, as cache["pattern", 0] takes
            raise ValueError(f"no hook point named {where!r}: here a point is named in full, e.g. "
                             f"{next(name for name in points if name.endswith(f'.{ending}'))}; every layer's: "
                             f"lambda name: name.endswith({ending!r})")
        raise ValueError(f"no hook point named {where!r} in this model: {why_missing([where], points)}")
    return [points[where]]


def stack_call_for(point: str, points: Iterable[str]) -> str:
    """What to write instead of stack_activation(point), a hook point's name, for a model with these
    points: the short name and, for a point of a block's norm, the part ("blocks.0.ln2.hook_scale" ->
    ('scale', part='ln2')); a point outside the blocks has one activation, no layers to stack."""
    points = list(points)
    named = point if point in points else next(  # hook_resid_post: a block's point, named without its block
        (name for name in points if re.fullmatch(rf"blocks\.0\.(?:\w+\.)?{re.escape(point)}", name)), None)
    if named is None:
        return f"no hook point of this model is named {point!r}: {why_missing([point], points)}"
    in_block = re.fullmatch(r"blocks\.\d+\.(?:(\w+)\.)?hook_(\w+)", named)
    if in_block is None:
        return f"{point!r} is one activation, not one per layer: read cache[{point!r}]"
    part, short = in_block.groups()
    if part in ("ln1", "ln2"):  # the names both norms have: scale, normalized
        return f"for {point!r}, cache.stack_activation({short!r}, part={part!r})"
    return f"for {point!r}, cache.stack_activation({short!r})"


PosSlice = int | slice | tuple | list | torch.Tensor | None  # the positions a stack keeps: TransformerLens's pos_slice


def at_positions(tensor: torch.Tensor, pos_slice: PosSlice, dim: int = -2) -> torch.Tensor:
    """tensor at the positions pos_slice keeps along dim: an int drops that dimension (TransformerLens's
    pos_slice=-1: the last token); a slice, a (start, stop) tuple or a list of positions keeps it;
    None keeps every position."""
    if pos_slice is None:
        return tensor
    T = tensor.size(dim)  # the text's positions
    past = f"pos_slice={pos_slice!r} is past the {T} positions of this text: give positions from {-T} to {T - 1}"
    if is_whole_number(pos_slice):
        if not -T <= operator.index(pos_slice) < T:
            raise ValueError(past)
        return tensor.select(dim, operator.index(pos_slice))
    given = pos_slice
    if isinstance(pos_slice, tuple):  # TransformerLens's (start, stop[, step])
        if not 1 <= len(pos_slice) <= 3:
            raise ValueError(f"pos_slice={given!r}: a tuple is (start, stop) or (start, stop, step), as slice() takes")
        pos_slice = slice(*pos_slice)
    if isinstance(pos_slice, slice):
        ends = (pos_slice.start, pos_slice.stop, pos_slice.step)
        if not all(end is None or is_whole_number(end) for end in ends) or (pos_slice.step is not None and pos_slice.step < 1):
            raise ValueError(f"pos_slice={given!r}: start, stop and step are whole numbers (or None), the step 1 or more: "
                             "positions are kept in order")
        if not range(T)[pos_slice]:  # (5, 2), slice(100, 200): an empty stack is a mistake, not an answer
            raise ValueError(f"pos_slice={given!r} keeps none of the {T} positions of this text: give (start, stop) "
                             f"with start before stop, both from {-T} to {T}")
        return tensor[(slice(None),) * (dim % tensor.dim()) + (pos_slice,)]
    if isinstance(pos_slice, list | torch.Tensor) and all(is_whole_number(p) for p in pos_slice):  # positions, kept in order
        positions = torch.as_tensor(pos_slice, dtype=torch.long).flatten()
        if positions.numel() == 0:
            raise ValueError(f"pos_slice={given!r} lists no position: give at least one, or None for all {T}")
        if not ((positions >= -T) & (positions < T)).all():
            raise ValueError(past)
        return tensor.index_select(dim, (positions % T).to(tensor.device))
    raise ValueError(f"pos_slice={pos_slice!r}: give a position (an int, e.g. -1 for the last token), a slice or "
                     "(start, stop), a list of positions, or None")


def why_missing(names: list[str], points: Iterable[str]) -> str:
    """Why a model with these hook points has none of names: the reason it lacks a TransformerLens
    name (MISSING_FOR_A_REASON, for a layer it has), else the points nearest the first name that has any."""
    points = list(points)
    for name in names:
        layer = re.match(r"blocks\.\d+\.", name)
        if layer is not None and not any(point.startswith(layer.group()) for point in points):
            continue  # blocks.9 of a 2-layer model: no reason of this model's applies
        reason = next((why for pattern, why in MISSING_FOR_A_REASON.items() if re.fullmatch(pattern, name)), None)
        if reason:
            return reason
    near = next((near for name in names if (near := difflib.get_close_matches(name, points, n=3, cutoff=0.6))), None)
    return f"did you mean {', '.join(near)}?" if near else "docs/hooks.md lists them all"


def parameters_of(fn: Callable) -> str:
    """fn's parameters as a learner wrote them, without their annotations: "(x, hook, scale=1.0)"."""
    signature = inspect.signature(fn)
    plain = [parameter.replace(annotation=inspect.Parameter.empty) for parameter in signature.parameters.values()]
    return str(signature.replace(parameters=plain, return_annotation=inspect.Signature.empty))


def can_take(fn: Callable, *args: object) -> bool:
    """Whether fn(*args) would bind to fn's parameters (True where fn shows none, as some built-ins:
    the call itself will tell)."""
    try:
        inspect.signature(fn).bind(*args)
    except TypeError:
        return False
    except ValueError:  # no signature to read
        pass
    return True


def check_hook_fn(fn: object, name: str) -> HookFn:
    """fn, if it can be called as fn(activation, hook); else one line saying what a hook function
    takes. Checked as it is attached to the point `name`, not in the middle of a forward."""
    if not callable(fn):
        raise TypeError(f"the hook for {name!r} is a {type(fn).__name__}, not a function: pass the function itself, "
                        "one that takes (activation, hook)")
    if inspect.isclass(fn):
        raise TypeError(f"the hook for {name!r} is the class {fn.__name__}: pass an instance of it, whose __call__ "
                        "takes (activation, hook)")
    if not can_take(fn, None, None):
        raise TypeError(f"the function for {name!r} takes {parameters_of(fn)}: a hook function is called with two "
                        "arguments, (activation, hook), and returns None or the activation to use")
    return fn


def checked_pairs(fwd_hooks: object) -> list[tuple[Where, object]]:
    """fwd_hooks as a list of (where, fn) pairs; ValueError in one line for another shape."""
    usage = "fwd_hooks is a list of (name, function) pairs, e.g. fwd_hooks=[(name, function)]"
    if isinstance(fwd_hooks, tuple) and len(fwd_hooks) == 2 and callable(fwd_hooks[1]):
        raise ValueError(f"{usage}: put the one pair in a list")
    if isinstance(fwd_hooks, str) or callable(fwd_hooks):
        raise ValueError(f"{usage}, not a {'name' if isinstance(fwd_hooks, str) else 'function'} alone")
    pairs = list(fwd_hooks)
    for pair in pairs:
        if not (isinstance(pair, tuple | list) and len(pair) == 2):
            raise ValueError(f"{usage}: {pair!r} is not such a pair")
        if callable(pair[0]) and isinstance(pair[1], str):
            raise ValueError(f"{usage}: ({getattr(pair[0], '__name__', 'function')}, {pair[1]!r}) has them the other "
                             "way round")
    return pairs


def is_whole_number(value: object) -> bool:
    """An int (a 0-d integer tensor's or numpy's too), not a bool or a float: what a layer or head number is."""
    if isinstance(value, bool) or getattr(value, "dtype", None) == torch.bool or getattr(value, "ndim", 0) != 0:
        return False
    try:
        operator.index(value)  # what a list index takes: no floats, no float tensors or arrays
    except TypeError:
        return False
    return True


def is_pattern(name: str) -> bool:
    """Picks every layer's attention weights, blocks.<l>.attn.hook_pattern."""
    return name.endswith("attn.hook_pattern")


class HookedModel(nn.Module):
    """The one door into a model's forward: hook points found by name, functions attached for a
    block of code, and a forward that keeps what it passed through."""

    @property
    def hook_dict(self) -> dict[str, HookPoint]:
        """Every hook point of the model by name."""
        return {point.name: point for point in hook_points_of(self).values()}

    def hook_points(self, where: Where) -> list[HookPoint]:
        """The points a name or a test on names picks; ValueError naming the near ones for an
        unknown name."""
        return pick(self.hook_dict, where)

    @contextmanager
    def hooks(self, fwd_hooks: Iterable[tuple[Where, HookFn]] = ()) -> Iterator["HookedModel"]:
        """Inside the block, each fn of fwd_hooks runs at the points its name or test picks; after
        it they are detached, even on error. Every name is checked before anything is attached."""
        points = self.hook_dict  # one walk of the modules, however many functions come
        attach = [(point, fn) for where, fn in checked_pairs(fwd_hooks) for point in pick(points, where)]
        detach = []
        try:
            for point, fn in attach:
                detach.append(point.add_hook(fn))
            yield self
        finally:
            for remove in reversed(detach):
                remove()

    def has_hooks(self) -> bool:
        """Whether any function is attached anywhere (the compiled decode step runs none)."""
        return any(point.fns for point in self.hook_dict.values())

    def reset_hooks(self) -> None:
        """Detach every function from every point (TransformerLens's name for it): for one attached
        with HookPoint.add_hook whose remover was lost, e.g. in a notebook cell run twice."""
        for point in self.hook_dict.values():
            point.fns.clear()

    def run_with_hooks(
        self, idx: torch.Tensor, fwd_hooks: Iterable[tuple[Where, HookFn]] = (), targets: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """forward(idx, targets), with fwd_hooks attached for this one call: (logits, loss)."""
        with self.hooks(fwd_hooks):
            return self(idx, targets)

    def run_with_cache(
        self, idx: torch.Tensor, names: Where | Iterable[str] | None = None,
        fwd_hooks: Iterable[tuple[Where, HookFn]] = (), *, names_filter: Where | Iterable[str] | None = None,
    ) -> tuple[torch.Tensor, "ActivationCache"]:
        """forward(idx) keeping the activations at the points `names` picks (a name, a list of
        names, a test on names; None: every point), detached from autograd; names_filter is
        TransformerLens's word for it. fwd_hooks run too, and the cache keeps what they hand on.
        Returns (logits, cache)."""
        if names_filter is not None:
            if names is not None:
                raise ValueError("names and names_filter are two words for one thing: give one of them")
            names = names_filter
        points = self.hook_dict
        if names is None:
            picked = list(points.values())
        elif isinstance(names, str) or callable(names):
            picked = pick(points, names)
        elif isinstance(names, Iterable):
            picked = [point for name in names for point in pick(points, name)]
        else:
            raise TypeError(f"names={names!r}: give a name, a list of names or a test on names (None: every point), "
                            "e.g. names=['blocks.0.attn.hook_pattern']")
        activations: dict[str, torch.Tensor] = {}
        copies = False  # set below: whether another function may edit, in place, a tensor two points share

        def keep(activation: torch.Tensor, hook: HookPoint) -> None:
            activations[hook.name] = activation.detach().clone() if copies else activation.detach()

        # The cache's functions come after fwd_hooks, so it keeps the activation the forward used. With
        # other functions attached it keeps a copy: resid_post of one block is resid_pre of the next, one
        # tensor, which a function there may edit in place after the first was kept.
        with self.hooks(fwd_hooks):
            copies = self.has_hooks()
            with self.hooks([(point.name, keep) for point in picked]):
                logits, _ = self(idx)
        return logits, ActivationCache(activations, self)  # in the order the forward reached them


class CacheKeyError(KeyError):
    """A cache's key it cannot answer: a KeyError, as a Mapping's is (and TransformerLens's), whose
    line prints as written; Python shows a plain KeyError's message in quotes, as if it were the key."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ActivationCache(Mapping[str, torch.Tensor]):
    """The activations one forward passed through its hook points, by name.

    cache["blocks.0.attn.hook_pattern"], or by TransformerLens's short forms cache["pattern", 0] and,
    for a name that two parts of a block have, cache["scale", 0, "ln2"] (in one word, as TransformerLens
    also takes them: "pattern0", "scale0ln2"); cache["embed"] for the points outside the blocks."""

    def __init__(self, activations: dict[str, torch.Tensor], model: HookedModel) -> None:
        self.activations = activations
        self.model = model

    def name_of(self, key: str | tuple[str, int] | tuple[str, int, str]) -> str:
        """The full name of a key: a full name stays; ("pattern", 0) -> "blocks.0.attn.hook_pattern"
        (the first part of the block that has the name: ("scale", 0) is ln1's); ("scale", 0, "ln2")
        -> "blocks.0.ln2.hook_scale" (a part that lacks the name is refused, where TransformerLens
        would take the name's own part); "embed" -> "hook_embed"."""
        known = self.model.hook_dict
        short, layer, part = self.parts_of(key)
        if layer is None and short in known:
            return short
        short = SHORT_NAMES.get(short, short)
        if layer is None:
            candidates = [short, f"hook_{short}", f"ln_final.hook_{short}", f"smear.hook_{short}"]
        else:
            n_layer = len(self.model.blocks)
            if not is_whole_number(layer):  # True would be layer 1; "1" and 1.0 are no index
                raise CacheKeyError(f"layer {layer!r} of {key!r} is not a whole number: give it as an int, e.g. "
                                    f"({short!r}, {n_layer - 1})")
            layer = operator.index(layer)  # an int, numpy's or torch's too
            if not -n_layer <= layer < n_layer:  # as a list's index: -1 is the last layer, -n_layer the first
                layers = "its one layer is 0 (or -1)" if n_layer == 1 else \
                    f"its {n_layer} layers are 0 to {n_layer - 1} (or -{n_layer} to -1 from the end)"
                raise CacheKeyError(f"layer {layer} of {key!r} is not in this model: {layers}")
            layer = layer % n_layer
            prefixes = ("", "attn.", "mlp.", "ln1.", "ln2.") if part is None else (BLOCK_PARTS[part],)
            candidates = [f"blocks.{layer}.{prefix}hook_{short}" for prefix in prefixes]
        for name in candidates:
            if name in known:
                return name
        raise CacheKeyError(f"no hook point for {key!r} in this model: {why_missing(candidates, known)}")

    @staticmethod
    def parts_of(key: object) -> tuple[str, object, str | None]:
        """(name, layer or None, part of the block or None) of a key in one of the forms name_of
        takes; KeyError naming those forms for anything else."""
        if isinstance(key, str):
            compact = re.fullmatch(r"([a-z]+)(\d+)([a-z]\w*)?", key)  # TransformerLens's "pattern1", "scale1ln2"
            if compact is None:
                return key, None, None
            key = (compact[1], int(compact[2]), *([compact[3]] if compact[3] else []))
        if isinstance(key, (tuple, list)) and len(key) in (2, 3) and isinstance(key[0], str):
            part = key[2] if len(key) == 3 else None
            if part is not None and not (isinstance(part, str) and part in BLOCK_PARTS):
                raise CacheKeyError(f"the part of a block in {key!r} is attn, mlp, ln1, ln2 or block (or TransformerLens's "
                                    f"a, attention, m, b, blocks): e.g. ('scale', 0, 'ln2')")
            if part is not None and key[1] is None:
                raise CacheKeyError(f"{key!r} names a part of a block but no layer: give one, e.g. ({key[0]!r}, 0, {part!r})")
            return key[0], key[1], part
        raise CacheKeyError(f"a cache's key is a name, (name, layer) or (name, layer, part of the block), e.g. "
                            f"'blocks.0.ln2.hook_scale', ('scale', 0) or ('scale', 0, 'ln2'); not {key!r}")

    def __getitem__(self, key: str | tuple[str, int] | tuple[str, int, str]) -> torch.Tensor:
        name = self.name_of(key)
        if name not in self.activations:
            kept = ", ".join(self.activations) if len(self.activations) <= 8 else (
                f"{len(self.activations)} names, {', '.join(list(self.activations)[:4])}, ...")
            raise CacheKeyError(f"this cache did not record {name!r}: it holds {kept}. "
                                f"Ask run_with_cache for it: names=[{name!r}, ...], or names=None for every point")
        return self.activations[name]

    def __iter__(self) -> Iterator[str]:
        return iter(self.activations)

    def __len__(self) -> int:
        return len(self.activations)

    def __repr__(self) -> str:
        return f"ActivationCache({len(self)} activations: {', '.join(list(self)[:3])}{', ...' if len(self) > 3 else ''})"

    def stack_activation(self, short: str, layer: int | None = -1, part: str | None = None) -> torch.Tensor:
        """One short name's activation in each layer before `layer` (-1 or None: every layer, as in
        TransformerLens), stacked: (layers, ...), e.g. "pattern" -> (L, B, H, T, S). part: where in
        the block, for a name two parts have, e.g. ("scale", ..., "ln2")."""
        if "." in short or short.startswith("hook_"):  # a point's name: blocks.0.ln2.hook_scale, hook_resid_post
            raise ValueError(f"stack_activation takes a short name, the same in every layer, not a hook point's: "
                             f"{stack_call_for(short, self.model.hook_dict)}")
        return torch.stack([self[(short, index) if part is None else (short, index, part)]
                            for index in self.layers_before(layer)])

    def stack_head_results(self, layer: int | None = -1, return_labels: bool = False, incl_remainder: bool = False,
                           pos_slice: PosSlice = None, apply_ln: bool = False) -> Any:
        """What each head of the layers before `layer` (-1 or None: every layer, as in TransformerLens)
        writes into the residual stream: its hook_z through its own D columns of the output
        projection, (layers * H, B, T, C), heads in layer order (the projection's bias, shared by the
        heads, is left out, as in TransformerLens). Their sum over a layer's heads plus that bias is
        the layer's attention output. With return_labels, also ["L0H0", "L0H1", ...]; incl_remainder:
        then "remainder", the rest of the stream leaving the last layer taken; pos_slice and apply_ln
        as for accumulated_resid. The arguments in TransformerLens's order."""
        results, labels = [], []
        for index in self.layers_before(layer):
            z = self["z", index]  # (B, T, H, D)
            H, D = z.shape[2], z.shape[3]
            W_O = self.model.blocks[index].attn.proj.weight.view(-1, H, D)  # (C, H * D) -> (C, H, D): head h's columns
            results.append(torch.einsum("bthd,chd->hbtc", z, W_O.to(z.dtype)))  # (H, B, T, C)
            labels += [f"L{index}H{head}" for head in range(H)]
        stacked = at_positions(torch.cat(results), pos_slice)  # (layers * H, B, T, C), T as pos_slice leaves it
        if incl_remainder:
            taken = at_positions(self["resid_post", len(self.layers_before(layer)) - 1], pos_slice)  # (B, T, C)
            stacked = torch.cat([stacked, (taken - stacked.sum(0))[None]])  # (layers * H + 1, B, T, C)
            labels.append("remainder")
        if apply_ln:
            stacked = self.apply_ln_to_stack(stacked, layer, pos_slice=pos_slice)
        return (stacked, labels) if return_labels else stacked

    def embedding_parts(self) -> tuple[list[str], list[torch.Tensor]]:
        """What the first block's input adds up to, each (B, T, C): "embed", then "smear" (what
        model.smear added to it) and "pos_embed" (learned positions) where the model has them."""
        embed, points = self["hook_embed"], self.model.hook_dict  # (B, T, C); the model's points
        labels, parts = ["embed"], [embed]
        if "smear.hook_out" in points:
            labels.append("smear")
            parts.append(self["smear.hook_out"] - embed)  # (B, T, C)
        if "hook_pos_embed" in points:
            labels.append("pos_embed")
            parts.append(self["hook_pos_embed"].expand_as(embed))  # (T, C) -> (B, T, C)
        return labels, parts

    def accumulated_resid(self, layer: int | None = -1, incl_mid: bool = False, apply_ln: bool = False,
                          pos_slice: PosSlice = None, mlp_input: bool = False, return_labels: bool = False) -> Any:
        """The residual stream entering each layer up to `layer` (0 to L; -1 or None: every layer, then
        the stream the final norm reads), as in TransformerLens: (P, B, T, C), labelled "0_pre", ...,
        "final_post"; "{l}_mid" too, between the attention and the MLP, with incl_mid (and for `layer`
        itself with mlp_input). pos_slice: the positions kept (at_positions: an int drops that
        dimension, (P, B, C)). apply_ln: each as its norm reads it, through the final norm itself where the
        stack ends there (a logit lens), else by apply_ln_to_stack."""
        n_layer, end = len(self.model.blocks), self.layer_up_to(layer)
        labels, parts = [], []
        for index in range(end + 1):
            if index == n_layer:
                labels.append("final_post")
                parts.append(self["resid_post", n_layer - 1])  # (B, T, C)
                continue
            labels.append(f"{index}_pre")
            parts.append(self["resid_pre", index])  # (B, T, C)
            if (incl_mid and index < end) or (mlp_input and index == end):
                labels.append(f"{index}_mid")
                parts.append(self["resid_mid", index])  # (B, T, C)
        stacked = at_positions(torch.stack(parts), pos_slice)  # (P, B, T, C), T as pos_slice leaves it
        if apply_ln:
            stacked = (self.model.ln_f.past_its_hook_points(stacked) if end == n_layer  # the norm reads the last dim
                       else self.apply_ln_to_stack(stacked, end, mlp_input, pos_slice))
        return (stacked, labels) if return_labels else stacked

    def decompose_resid(self, layer: int | None = -1, mlp_input: bool = False, mode: str = "all", apply_ln: bool = False,
                        pos_slice: PosSlice = None, incl_embeds: bool = True, return_labels: bool = False) -> Any:
        """The parts the residual stream entering `layer` (0 to L; -1 or None: the stream the final norm
        reads) adds up to, as in TransformerLens: (P, B, T, C), the embeddings (embedding_parts; without
        them, incl_embeds=False), then each earlier layer's "{l}_attn_out" and "{l}_mlp_out" (mode
        "attn" or "mlp": one of them), and with mlp_input `layer`'s own attention output. pos_slice
        as for accumulated_resid; apply_ln: by apply_ln_to_stack."""
        if mode not in ("all", "attn", "mlp"):
            raise ValueError(f"mode={mode!r}: give all, attn or mlp, as in TransformerLens")
        end = self.layer_up_to(layer)
        kinds = {"all": ("attn_out", "mlp_out"), "attn": ("attn_out",), "mlp": ("mlp_out",)}[mode]
        if mlp_input and "attn_out" in kinds and end == len(self.model.blocks):
            raise ValueError(f"mlp_input=True adds the attention output a layer's MLP norm reads, and layer={layer!r} is "
                             f"the final norm's: give a layer from 0 to {end - 1}")
        added = [(index, kind) for index in range(end) for kind in kinds]
        if mlp_input and "attn_out" in kinds:  # what the layer's MLP norm reads: its attention's output too
            added.append((end, "attn_out"))
        labels, parts = self.embedding_parts() if incl_embeds else ([], [])
        for index, kind in added:
            labels.append(f"{index}_{kind}")
            parts.append(self[kind, index])  # (B, T, C)
        if not parts:
            raise ValueError(f"layer={layer!r} without the embeddings leaves no part to stack: give a later layer, "
                             "or incl_embeds=True")
        stacked = at_positions(torch.stack(parts), pos_slice)  # (P, B, T, C), T as pos_slice leaves it
        if apply_ln:
            stacked = self.apply_ln_to_stack(stacked, end, mlp_input, pos_slice)
        return (stacked, labels) if return_labels else stacked

    def apply_ln_to_stack(self, residual_stack: torch.Tensor, layer: int | None = -1, mlp_input: bool = False,
                          pos_slice: PosSlice = None) -> torch.Tensor:
        """residual_stack (P, B, T, C), parts of the stream entering `layer` (-1 or None: the final
        norm's; with mlp_input, the stream the layer's MLP norm reads), as that norm treats them
        without its gain and bias, as in TransformerLens: centred where the norms are LayerNorms, then
        divided by the scale (B, T, 1) the norm found for the whole stream, so they still add up. A
        stack of some positions, (P, B, C) or (P, B, T', C), takes the pos_slice that picked them."""
        n_layer, end = len(self.model.blocks), self.layer_up_to(layer)
        name = "ln_final.hook_scale" if end == n_layer else f"blocks.{end}.ln{2 if mlp_input else 1}.hook_scale"
        scale = at_positions(self[name], pos_slice, dim=1)  # (B, T, 1) -> (B, 1) or (B, T', 1)
        C = self.model.config.n_embd
        fits = residual_stack.dim() in (scale.dim(), scale.dim() + 1) and (  # (P, B, T, C) or (B, T, C), as the scale
            tuple(residual_stack.shape[-scale.dim():]) == (*scale.shape[:-1], C))
        if not fits:
            raise ValueError(f"a stack of shape {tuple(residual_stack.shape)} does not fit the scale of shape "
                             f"{tuple(scale.shape)} the norm found{'' if pos_slice is None else f' at pos_slice={pos_slice!r}'}: "
                             f"its last dimensions must be {(*scale.shape[:-1], C)} (C = {C}, the model's width), parts "
                             "first or not; a stack of some positions takes the pos_slice that picked them (pos_slice=-1 "
                             "for [:, :, -1])")
        if self.model.config.norm == "layernorm":
            residual_stack = residual_stack - residual_stack.mean(dim=-1, keepdim=True)  # (P, B, T, C)
        return residual_stack / scale  # (P, B, T, C) / (B, T, 1)

    def layer_up_to(self, layer: object) -> int:
        """The layer a residual stack ends at, as TransformerLens counts it: 0 to L, the stream
        entering that layer (L: the one the final norm reads; -1 or None too); ValueError in one line
        for anything else."""
        n_layer = len(self.model.blocks)
        if layer is None or (is_whole_number(layer) and operator.index(layer) == -1):
            return n_layer
        if is_whole_number(layer) and 0 <= operator.index(layer) <= n_layer:
            return operator.index(layer)
        raise ValueError(f"layer={layer!r}: a residual stack ends at the stream entering a layer, 0 to {n_layer} "
                         f"({n_layer}, -1 or None: the one the final norm reads), as in TransformerLens")

    def layers_before(self, layer: object) -> range:
        """The layers a stack takes, 0 .. layer - 1, as TransformerLens counts them: layer is 1 to L
        (-1 or None: all L); ValueError in one line for anything else."""
        n_layer = len(self.model.blocks)
        if layer is None:
            return range(n_layer)
        count = operator.index(layer) if is_whole_number(layer) else None  # True would be 1
        if count == -1:
            return range(n_layer)
        if count is not None and 1 <= count <= n_layer:
            return range(count)
        raise ValueError(f"layer={layer!r}: a stack takes the layers before it, so layer is 1 to {n_layer} "
                         f"(-1 or None: all {n_layer}), as in TransformerLens; for the labels, return_labels=True")


# TransformerLens's short forms that are not the end of a hook's name.
SHORT_NAMES = {"attn": "pattern", "scores": "attn_scores", "attn_logits": "attn_scores", "query": "q", "key": "k",
               "value": "v", "mlp_pre": "pre", "mlp_post": "post"}
# The third part of a key such as ("scale", 0, "ln2"), TransformerLens's spellings too: where in block
# `layer` the name is.
BLOCK_PARTS = {"attn": "attn.", "a": "attn.", "attention": "attn.", "mlp": "mlp.", "m": "mlp.", "ln1": "ln1.",
               "ln2": "ln2.", "block": "", "blocks": "", "b": ""}
