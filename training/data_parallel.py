"""How the ranks share the training (train.parallel): ddp, where every rank holds the whole model
and DistributedDataParallel averages the gradients, or fsdp, where PyTorch's FSDP2
(fully_shard) gives each rank a 1/N shard of every parameter, gradient and optimizer state and
gathers a block's weights only while it runs. Both save the same single-file checkpoint (the
whole model, the whole optimizer state), so either resumes the other's runs. docs/fsdp.md
says what each costs.
"""

import functools
import inspect
from collections.abc import Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import (
    StateDictOptions,
    get_model_state_dict,
    get_optimizer_state_dict,
    set_model_state_dict,
    set_optimizer_state_dict,
)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import FSDPModule, fully_shard
from torch.distributed.tensor import DTensor
from torch.nn.parallel import DistributedDataParallel

from model import GPT
from model_io.checkpoint import load_weights
from runtime.ranks import Ranks
from training.optimizer import Optimizers

PARALLELS = ("ddp", "fsdp")  # train.parallel: how the ranks share the training

# The whole tensors, on rank 0 alone, in CPU memory: the checkpoint's form.
WHOLE_ON_RANK_0 = StateDictOptions(full_state_dict=True, cpu_offload=True)

# DDP's switch for re-sending the buffers before every forward: forward_sync_buffers since torch
# 2.13 (which deprecates the old name), broadcast_buffers before it (requirements.txt allows 2.9).
# (The new one still sends them once, at the start; the old one did not. The RoPE tables are the
# same on every rank either way.)
NO_BUFFER_SYNC = ({"forward_sync_buffers": False}
                  if "forward_sync_buffers" in inspect.signature(DistributedDataParallel.__init__).parameters
                  else {"broadcast_buffers": False})


def forget_forwards(root: FSDPModule, units: list[FSDPModule]) -> None:
    """Forget the forwards rank 0 ran alone, and reshard every unit. FSDP records the order in which
    units run forward and plans the next backward's prefetches (all-gathers, collectives) from it:
    from rank 0's extra forwards, rank 0 alone would prefetch, and the ranks would wait on each other."""
    if hasattr(root, "reset_iter_state"):  # newer torch (2.13 has it; 2.11 does not)
        root.reset_iter_state()
    else:
        forget_forwards_by_hand(root, units)


def forget_forwards_by_hand(root: FSDPModule, units: list[FSDPModule]) -> None:
    """What reset_iter_state does that matters here, for a torch without it: reshard, and clear the
    records by FSDP2's private names (checked on torch 2.11, whose unit holds one _fsdp_param_group
    where 2.13's holds a list; tests/test_fsdp.py passed there, 2026-11-26)."""
    for unit in units:
        unit.reshard()
    root._get_fsdp_state()._comm_ctx.post_forward_order.clear()
    for unit in units:
        state = unit._get_fsdp_state()
        groups = getattr(state, "_fsdp_param_groups", None) or [state._fsdp_param_group]
        for group in groups:
            if group is not None:
                group._post_forward_indices.clear()


class Replicated:
    """train.parallel=ddp, and any run on one process: each rank a whole copy of the model."""

    collective_forwards = False  # True: a forward gathers weights from every rank, so all must run as many

    def __init__(self, model: GPT, ranks: Ranks) -> None:
        self.model = model
        # Its buffers (RoPE tables) are constants: no need to re-send them before every forward.
        self.ddp = DistributedDataParallel(model, **NO_BUFFER_SYNC) if ranks.distributed else None
        self.step_model: nn.Module = self.ddp or model

    def gradient_sync(self, sync: bool) -> AbstractContextManager:
        """Around a micro-step's backward: sync=False keeps its gradients on this rank, to add to
        the next micro-step's; DDP averages them over the ranks in the last one's backward."""
        return nullcontext() if self.ddp is None or sync else self.ddp.no_sync()

    def whole_model(self) -> AbstractContextManager:
        """Around work rank 0 alone does on the model (attention maps, samples): the model is whole already."""
        return nullcontext()

    def model_state(self) -> dict[str, torch.Tensor]:
        return self.model.state_dict()

    def optimizer_state(self, optimizer: Optimizers) -> dict[str, Any]:
        return optimizer.state_dict()

    def load(self, weights: dict[str, torch.Tensor], optimizer: Optimizers, optimizer_state: dict[str, Any]) -> None:
        load_weights(self.model, weights)
        optimizer.load_state_dict(optimizer_state)


class Sharded(Replicated):
    """train.parallel=fsdp: each block, and the rest of the model (embeddings, head, last norm)
    as one more unit, sharded over the ranks. The optimizer must be built after this, on the
    sharded parameters (DTensors)."""

    collective_forwards = True

    def __init__(self, model: GPT, ranks: Ranks) -> None:
        self.model, self.ddp = model, None
        # Each rank built its own random model (its own seed): all start as rank 0's, as under DDP.
        for tensor in model.state_dict().values():
            dist.broadcast(tensor, src=0)
        # The ranks' own device: without a mesh, fully_shard puts the shards on the GPU wherever
        # there is one, also for a run on train.device=cpu over gloo.
        mesh = init_device_mesh(ranks.device.type, (ranks.world_size,))
        for block in model.blocks:
            fully_shard(block, mesh=mesh, reshard_after_forward=True)  # freed after its forward, gathered again for backward
        fully_shard(model, mesh=mesh, reshard_after_forward=False)  # the head runs last and its backward first: keep it
        self.step_model = model
        self.root: FSDPModule = model  # type: ignore[assignment]  # fully_shard made GPT an FSDPModule

    def gradient_sync(self, sync: bool) -> AbstractContextManager:
        self.root.set_requires_gradient_sync(sync)  # sync=False: no reduce-scatter; gradients add up unsharded
        return nullcontext()

    @contextmanager
    def whole_model(self) -> Iterator[None]:
        """Every rank gathers every block (a collective, so every rank must enter), so that rank 0
        may run forwards alone, as many as it likes; afterwards the shards are all each keeps."""
        units = [module for module in self.model.modules() if isinstance(module, FSDPModule)]
        for unit in units:
            unit.set_reshard_after_forward(False, recurse=False)
            unit.unshard()
        try:
            yield
        finally:
            forget_forwards(self.root, units)
            for block in self.model.blocks:
                block.set_reshard_after_forward(True, recurse=False)

    def model_state(self) -> dict[str, torch.Tensor]:
        """The whole weights on rank 0 ({} on the others); every rank must call it."""
        return get_model_state_dict(self.model, options=WHOLE_ON_RANK_0)

    def optimizer_state(self, optimizer: Optimizers) -> dict[str, Any]:
        """optimizer.state_dict() as one process would write it, on rank 0 ({} on the others); every
        rank must call it."""
        saved = [get_optimizer_state_dict(self.model, one, options=WHOLE_ON_RANK_0) for one in optimizer.optimizers]
        return {"optimizers": [numbered(state) for state in saved]} if saved[0] else {}

    def load(self, weights: dict[str, torch.Tensor], optimizer: Optimizers, optimizer_state: dict[str, Any]) -> None:
        set_model_state_dict(self.model, weights, options=StateDictOptions(full_state_dict=True))
        names = {param: name for name, param in self.model.named_parameters()}

        def load_one(one: torch.optim.Optimizer, saved: dict[str, Any]) -> None:
            set_optimizer_state_dict(self.model, one, named(saved, one, names), options=StateDictOptions(full_state_dict=True))
        optimizer.load_state_dict(optimizer_state, load_one)


def wrap(model: GPT, parallel: str, ranks: Ranks) -> Replicated:
    """How the ranks share the training of model; one process is always Replicated (nothing to share)."""
    return Sharded(model, ranks) if parallel == "fsdp" and ranks.distributed else Replicated(model, ranks)


def numbered(state: dict[str, Any]) -> dict[str, Any]:
    """An optimizer state keyed by parameter names (torch.distributed.checkpoint's form) keyed by
    numbers instead, 0, 1, ... through the param groups in order, as Optimizer.state_dict() keys it."""
    number = {name: i for i, name in enumerate(name for group in state["param_groups"] for name in group["params"])}
    return {"state": {number[name]: value for name, value in state["state"].items()},
            "param_groups": [{**group, "params": [number[name] for name in group["params"]]} for group in state["param_groups"]]}


def named(state: dict[str, Any], optimizer: torch.optim.Optimizer, names: dict[nn.Parameter, str]) -> dict[str, Any]:
    """numbered's inverse, for this optimizer's parameters."""
    name_of = [names[param] for group in optimizer.param_groups for param in group["params"]]
    return {"state": {name_of[number]: value for number, value in state["state"].items()},
            "param_groups": [{**group, "params": [name_of[number] for number in group["params"]]} for group in state["param_groups"]]}


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """A DTensor (FSDP's gradient norm, say) as the whole tensor it stands for; others as they are."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes this rank holds for these tensors: a sharded one's local shard only."""
    return sum(t.to_local().nbytes if isinstance(t, DTensor) else t.nbytes for t in tensors)


def memory_line(model: nn.Module, optimizer: Optimizers, ranks: Ranks) -> str:
    """What the rank that holds the most keeps of the model between steps (every rank must call it)."""
    held = {
        "parameters": local_bytes(model.parameters()),
        "gradients": local_bytes(p.grad for p in model.parameters() if p.grad is not None),
        "optimizer state": local_bytes(t for one in optimizer.optimizers for state in one.state.values()
                                       for t in state.values() if isinstance(t, torch.Tensor)),
    }
    most = {what: ranks.max(n) for what, n in held.items()}
    return (f"memory: the most one process holds is {', '.join(f'{n / 2**20:.2f} MiB of {what}' for what, n in most.items())} "
            f"({sum(most.values()) / 2**20:.2f} MiB)")


def forget_dtensor_shardings() -> None:
    """Empty the caches that train.parallel=fsdp fills through DTensor (then a gc.collect() frees what
    they held, in reference cycles): the shardings worked out for
    each op (in Python and in torch's C++ fast path), the plans and steps for moving a tensor from one
    sharding to another, and the mesh's topology. Their entries hold FSDP's device mesh, which holds
    the process group: kept, the group and its Gloo threads outlive destroy_process_group, as they would
    with torch.distributed.nn's default arguments (runtime/ranks.py). The caches are torch's private ones, so each
    is looked up and skipped where a torch version lacks it; tests/test_fsdp.py checks that a stopped
    and a resumed FSDP run end with no Gloo thread left. On torch 2.11 that is not enough: something
    Python's garbage collector cannot see still holds the mesh (docs/speed.md, On a GPU)."""
    from torch.distributed.tensor import _collective_utils, _redistribute, _sharding_prop  # torch's private modules
    for owner, name in ((torch._C, "_clear_DTensor_sharding_propagator_cache"),  # the C++ fast path's
                        (DTensor, "_op_dispatcher.sharding_propagator.propagate_op_sharding.cache_clear"),
                        (_sharding_prop, "ShardingPropagator._propagate_tensor_meta_cached.cache_clear"),
                        (_redistribute, "_gen_transform_infos.cache_clear"),
                        (_redistribute, "clear_redistribute_planner_cache"),
                        (_collective_utils, "MeshTopoInfo.build_from_mesh.cache_clear")):
        clear = functools.reduce(lambda found, part: getattr(found, part, None), name.split("."), owner)
        if clear is not None:
            clear()
