"""One process or many: what train.py needs to know about the other processes.

`torchrun --nproc_per_node=N train.py ...` starts N copies of train.py, one per "rank", and
tells each its place through environment variables: RANK (0 .. WORLD_SIZE-1 over all
machines), LOCAL_RANK (its index on this machine) and WORLD_SIZE. Started without torchrun,
train.py is rank 0 of 1 and none of this costs anything. Rank 0 alone logs, samples and saves.

DistributedDataParallel (training/build.py) averages the gradients over ranks during backward(),
so every rank takes the same optimizer step, and the ranks stay identical copies of one model.
"""

import os
import signal
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import NoReturn

import torch
import torch.distributed as dist

# Imported before any process group exists, on purpose: torch.distributed.nn binds the default
# group, as it is at that moment, into default arguments, where nothing frees it. Imported later
# (torch._dynamo imports it, e.g. for the first optimizer), it would keep the group and its
# threads alive past destroy_process_group, to be torn down with the process, which now and then
# aborts ("terminate called without an active exception").
import torch.distributed.nn  # noqa: F401

from runtime.devices import Machine, pick_device
from user_error import UserError


def env_rank() -> int:
    """This process's rank as torchrun set it (0 when started without torchrun)."""
    return int(os.environ.get("RANK", "0"))


def env_world_size() -> int:
    """How many processes torchrun started in all (1 without torchrun)."""
    return int(os.environ.get("WORLD_SIZE", "1"))


def restart_count() -> int:
    """How many times torchrun has restarted the processes (--max-restarts); 0 without torchrun."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def torchrun_store() -> dist.TCPStore | None:
    """torchrun's own key-value store, which outlives the processes torchrun restarts; None
    without torchrun (or with TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which keeps it to torchrun)."""
    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return None
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False)


def rank_zero_choice(key: str, value: Callable[[], str]) -> str:
    """Under torchrun, the value rank 0 made for key first, in this attempt or an earlier one
    (the other ranks wait for it); without torchrun, value(). value() runs in rank 0 alone, and
    only until an attempt has stored what it made (an attempt's rank 0 starts after the earlier
    attempt's has ended: one that died between the two makes it again)."""
    store = torchrun_store()
    if store is None:
        return value()
    if env_rank() == 0 and not store.check([key]):
        store.set(key, value())
    return store.get(key).decode()


class Ranks:
    def __init__(self, rank: int, local_rank: int, world_size: int, device: torch.device,
                 host_group: dist.ProcessGroup | None = None) -> None:
        """host_group: where the ranks agree on plain numbers (sum, max): the default group, or
        with NCCL a gloo group over the same processes, so that agreeing waits for no GPU."""
        self.rank, self.local_rank, self.world_size, self.device = rank, local_rank, world_size, device
        self.host_group = host_group

    @classmethod
    def join(cls, device_name: str, machine: Machine) -> "Ranks":
        rank, world_size = env_rank(), env_world_size()
        local_rank = int(os.environ.get("LOCAL_RANK", "0"))
        device = pick_device(device_name, machine, local_rank, world_size)
        if world_size > 1:
            if device.type == "cuda":
                torch.cuda.set_device(device)  # NCCL talks through the current device
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", store=this_attempts_store(),
                                    rank=rank, world_size=world_size)
            # The loop agrees on Ctrl-C after every step: over NCCL that number would travel
            # through the GPU's queue and wait for all of it; over gloo it stays on the hosts.
            host_group = dist.new_group(backend="gloo") if device.type == "cuda" else None
            return cls(rank, local_rank, world_size, device, host_group)
        return cls(rank, local_rank, world_size, device)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def sum(self, value: float) -> float:
        return self._all_reduce(value, dist.ReduceOp.SUM)

    def max(self, value: float) -> float:
        return self._all_reduce(value, dist.ReduceOp.MAX)

    def sum_on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """The sum of tensor over the ranks, left on the device: no rank waits for it here."""
        if not self.distributed:
            return tensor
        total = tensor.detach().clone()
        dist.all_reduce(total, op=dist.ReduceOp.SUM)
        return total

    def _all_reduce(self, value: float, op: dist.ReduceOp) -> float:
        if not self.distributed:
            return value
        tensor = torch.tensor([value], dtype=torch.float64)  # on the host: host_group is gloo's
        dist.all_reduce(tensor, op=op, group=self.host_group)
        return tensor.item()

    def gather(self, obj: object) -> list | None:
        if not self.distributed:
            return [obj]
        gathered = [None] * self.world_size if self.is_main else None
        dist.gather_object(obj, gathered, dst=0)
        return gathered

    def barrier(self) -> None:
        if self.distributed:
            dist.barrier()


def this_attempts_store() -> dist.Store | None:
    """Where the processes meet: torchrun's store, under a prefix of this attempt's own. torchrun
    keeps its store across restarts, but torch 2.13 keys the processes' addresses in it without
    the attempt (torch/distributed/rendezvous.py expects a new store per attempt): a restarted
    process would read the address of a process that died, and fail to connect. None (torch's
    own env:// meeting) without torchrun's store."""
    store = torchrun_store()
    return dist.PrefixStore(f"train.py attempt {restart_count()}/", store) if store else None


def lost_contact(err: BaseException) -> bool:
    """Whether err is a collective failing because another rank is gone (it failed or was stopped)."""
    return isinstance(err, dist.DistError) or any(
        words in str(err) for words in ("Connection closed by peer", "Connection reset by peer", "remote worker")
    )


def dist_backend() -> str:
    return dist.get_backend() if dist.is_initialized() else "none"


def leave_process_group() -> None:
    """The last thing a process does under torchrun (a no-op without it). Once nothing else holds
    the group (DistributedDataParallel does until collected, DTensor's caches until emptied: train.py),
    it ends here, and its threads with it."""
    if dist.is_initialized():
        dist.destroy_process_group()


@contextmanager
def said_once_per_machine() -> Iterator[None]:
    """Under torchrun every process on a machine reads the same command line and config files,
    so a check of the config alone fails the same way in each of them. The first process on
    the machine (LOCAL_RANK 0) says why; the others leave it to that one."""
    try:
        yield
    except UserError as err:
        leave_it_to_local_rank_zero(str(err))
        raise


def leave_it_to_local_rank_zero(message: str) -> None:
    """In a process other than the first on its machine, wait for torchrun to stop it: torchrun
    stops every process once one has failed, so local rank 0 says the error and is reported as
    the cause. (Were this one to exit first, torchrun could stop local rank 0 before it spoke.)"""
    if os.environ.get("LOCAL_RANK", "0") in ("", "0") or os.environ.get("WORLD_SIZE", "1") in ("", "1"):
        return  # the first process on its machine, or not started by torchrun
    # (One that torchrun stops before it gets here, still checking its config, ends as train.py's
    # ended_by_sigterm ends it, and takes back its run dir too.)
    wait_for_torchrun_to_stop_this_process(seconds=60)
    print(f"error: {message}", file=sys.stderr, flush=True)  # nobody stopped us: say it after all
    sys.exit(2)


LOST_CONTACT_WAIT_SECONDS = 10.0


def lost_contact_said(rank: int) -> NoReturn:
    """A rank whose collective failed because another rank stopped says so, then waits for torchrun
    to stop it: torchrun names the first process to exit as the run's cause, which must be the one
    that failed (its own line says why). Where no stop comes, as when that one was on another
    machine, whose torchrun ends the run, it exits after LOST_CONTACT_WAIT_SECONDS."""
    print(f"error: rank {rank} lost contact with the other processes: one of them stopped (its own message says why)",
          file=sys.stderr, flush=True)
    wait_for_torchrun_to_stop_this_process(LOST_CONTACT_WAIT_SECONDS)
    sys.exit(2)


@contextmanager
def ended_by_sigterm() -> Iterator[None]:
    """Inside, SIGTERM (torchrun stopping this process because another one failed, or `kill`) ends
    the process through the callers' finally blocks, which take back the empty run dir Hydra made for
    it; Python's default ends it on the spot and leaves that folder behind. (The training loop's
    StopSignals, inside, hears SIGTERM as a request to save and stop instead.)"""
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


def wait_for_torchrun_to_stop_this_process(seconds: float) -> None:
    """Sleeps until torchrun's SIGTERM, which leaves through the callers' finally blocks (they take
    back the empty run dir Hydra made for this process), or until `seconds` have passed."""
    with ended_by_sigterm():
        try:
            deadline = time.monotonic() + seconds
            # Python runs a signal's handler between bytecodes: one that lands just before a sleep starts
            # waits for that sleep to end, so short ones (0.1 s, not 60).
            while time.monotonic() < deadline:
                time.sleep(0.1)
        except KeyboardInterrupt:
            sys.exit(130)  # Ctrl-C reaches every process: the one that failed says what went wrong
