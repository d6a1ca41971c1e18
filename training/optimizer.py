"""The optimizer: Muon for the hidden weight matrices with AdamW for the rest (the default,
optim.name=muon), or AdamW for everything (optim.name=adamw).

AdamW decays the 2-D weight matrices only: biases and norm gains are not decayed, since
shrinking a gain towards 0 would only fight the normalisation it exists to undo.

Muon updates each hidden matrix (the attention and MLP projections of the blocks) with an
orthogonalised momentum: every direction of the matrix moves by a similar amount, which often
learns faster per step. The embeddings, the LM head, and the biases and gains stay with AdamW,
as Muon is meant for hidden 2-D layers only. Its learning rate is scaled to match AdamW's
update size (adjust_lr_fn="match_rms_adamw"), so optim.lr and its schedule serve both.
"""

from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from runtime.devices import Machine
from training.specs import OptimSpec

OPTIMIZERS = ("adamw", "muon")
NS_DTYPES = ("auto", "float32", "bfloat16")


class Muon(torch.optim.Muon):
    """torch.optim.Muon's update (same hyperparameters, same state), with its Newton-Schulz
    iterations run on all same-shaped matrices at once, in ns_dtype. torch.optim.Muon runs them
    one matrix at a time in bfloat16, which is quick on a GPU but some 45 times slower than
    float32 on a CPU without AVX-512 BF16."""

    def __init__(self, params: Any, *, ns_dtype: torch.dtype = torch.float32, **hyperparameters: Any) -> None:
        super().__init__(params, **hyperparameters)
        self.ns_dtype = ns_dtype  # how to compute, not what: kept out of the saved param groups

    @torch.no_grad()
    def step(self, closure: Callable[[], Tensor] | None = None) -> Tensor | None:
        loss = None
        if closure is not None:  # torch's contract: re-evaluate the loss (with gradients) first
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            momenta = [self.momentum(p, group) for p in params]
            updates = orthogonalise(momenta, group["ns_coefficients"], group["ns_steps"], group["eps"], self.ns_dtype)
            for param, update in zip(params, updates, strict=True):
                param.mul_(1 - group["lr"] * group["weight_decay"])
                param.add_(update, alpha=-group["lr"] * lr_scale(group["adjust_lr_fn"], param.shape))
        return loss

    def momentum(self, param: Tensor, group: Mapping[str, Any]) -> Tensor:
        """The running average of the gradient, with Nesterov's look-ahead if the group asks."""
        state = self.state[param]
        if "momentum_buffer" not in state:
            state["momentum_buffer"] = torch.zeros_like(param.grad)
        buffer = state["momentum_buffer"]
        buffer.lerp_(param.grad, 1 - group["momentum"])
        return param.grad.lerp(buffer, group["momentum"]) if group["nesterov"] else buffer


def orthogonalise(matrices: list[Tensor], coefficients: tuple[float, float, float], steps: int, eps: float,
                  dtype: torch.dtype) -> list[Tensor]:
    """Each matrix moved towards the nearest semi-orthogonal one (U V^T of its SVD, singular
    values ending between about 0.5 and 1.5), by `steps` quintic Newton-Schulz iterations;
    matrices of one shape (a tall one counts as its transpose) go through as one batch."""
    wide = [m.mT if m.size(0) > m.size(1) else m for m in matrices]  # (rows, cols), rows <= cols
    by_shape = defaultdict(list)
    for index, matrix in enumerate(wide):
        by_shape[matrix.shape].append(index)
    results = {}
    for indices in by_shape.values():
        batch = newton_schulz(torch.stack([wide[i] for i in indices]).to(dtype), coefficients, steps, eps)
        for index, result in zip(indices, batch, strict=True):
            tall = matrices[index].size(0) > matrices[index].size(1)
            results[index] = (result.mT if tall else result).to(matrices[index].dtype)
    return [results[index] for index in range(len(matrices))]


def newton_schulz(x: Tensor, coefficients: tuple[float, float, float], steps: int, eps: float) -> Tensor:
    """(N, rows, cols) -> (N, rows, cols): X <- aX + (bG + cG^2)X with G = XX^T, from X scaled
    so that its spectral norm is at most 1 (its Frobenius norm is)."""
    a, b, c = coefficients
    x = x / x.norm(dim=(-2, -1), keepdim=True).clamp_min(eps)
    for _ in range(steps):
        gram = x @ x.mT  # (N, rows, rows): the smaller side, which is why tall matrices are transposed
        polynomial = torch.baddbmm(gram, gram, gram, beta=b, alpha=c)
        x = torch.baddbmm(x, polynomial, x, beta=a)
    return x


def lr_scale(adjust_lr_fn: str | None, shape: torch.Size) -> float:
    """torch.optim.Muon's learning-rate adjustment for a (rows, cols) matrix."""
    rows, cols = shape
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * max(rows, cols) ** 0.5  # an update as large, per entry, as AdamW's
    if adjust_lr_fn in (None, "original"):
        return max(1.0, rows / cols) ** 0.5
    return 1.0


def ns_dtype_for(name: str, device: torch.device, machine: Machine) -> torch.dtype:
    """auto: bfloat16 on a GPU that computes in it natively (as torch.optim.Muon does), float32
    elsewhere: on a CPU, and on an older GPU (a T4, a V100), where bfloat16 matmuls are emulated."""
    if name == "auto":
        return torch.bfloat16 if device.type == "cuda" and machine.cuda_bf16 else torch.float32
    return getattr(torch, name)


class Optimizers:
    """Several optimizers that step, zero and save as one."""

    def __init__(self, *optimizers: torch.optim.Optimizer) -> None:
        self.optimizers = optimizers

    @property
    def param_groups(self) -> list[dict[str, Any]]:
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def zero_grad(self, set_to_none: bool = True) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=set_to_none)

    def step(self) -> None:
        for optimizer in self.optimizers:
            optimizer.step()

    def state_dict(self) -> dict[str, Any]:
        return {"optimizers": [optimizer.state_dict() for optimizer in self.optimizers]}

    def load_state_dict(self, state: dict[str, Any],
                        load: Callable[[torch.optim.Optimizer, dict[str, Any]], None] | None = None) -> None:
        """The saved state (moments, momenta, step counts) under the hyperparameters these
        optimizers were built with: a resumed run may change them (optim.weight_decay=...),
        where torch's load_state_dict would bring the saved ones back. load(optimizer, saved)
        puts one optimizer's state in: torch's load_state_dict unless given (FSDP gives its own)."""
        for optimizer, saved in zip(self.optimizers, state["optimizers"], strict=True):
            settings = [{key: value for key, value in group.items() if key != "params"} for group in optimizer.param_groups]
            if load is None:
                optimizer.load_state_dict(saved)
            else:
                load(optimizer, saved)
            for group, setting in zip(optimizer.param_groups, settings, strict=True):
                group.update(setting)


def is_hidden_matrix(name: str, param: nn.Parameter) -> bool:
    """A 2-D weight inside a transformer block (not an embedding, not the head)."""
    return param.dim() == 2 and name.startswith("blocks.")


def build_optimizer(model: nn.Module, spec: OptimSpec, device: torch.device,
                    machine: Machine | None = None) -> Optimizers:
    """AdamW, and with spec.name muon, Muon for the blocks' matrices; machine (this one unless
    given) decides ns_dtype=auto."""
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    use_muon = spec.name == "muon"
    for_muon = [p for name, p in named if use_muon and is_hidden_matrix(name, p)]
    for_adamw = [(name, p) for name, p in named if not (use_muon and is_hidden_matrix(name, p))]
    groups = [
        {"params": [p for _, p in for_adamw if p.dim() >= 2], "weight_decay": spec.weight_decay},
        {"params": [p for _, p in for_adamw if p.dim() < 2], "weight_decay": 0.0},
    ]
    # The fused kernel is a CUDA speed-up; on CPU the default implementation is used.
    optimizers = [torch.optim.AdamW(groups, lr=spec.lr, betas=spec.betas, fused=device.type == "cuda")]
    if for_muon:
        optimizers.append(Muon(
            for_muon, lr=spec.lr, weight_decay=spec.weight_decay, momentum=spec.muon_momentum,
            adjust_lr_fn="match_rms_adamw", ns_dtype=ns_dtype_for(spec.ns_dtype, device, machine or Machine.this_one()),
        ))
    return Optimizers(*optimizers)
