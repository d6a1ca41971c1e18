"""What several test files share; tests/conftest.py keeps the fixtures. Nothing here is fetched
from the network: the tiny Hugging Face GPT-2s are made offline with transformers and tokenizers."""

import dataclasses
import importlib
import io
import logging
import math
import os
import re
import resource
import runpy
import shutil
import signal
import string
import subprocess
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from contextlib import contextmanager, redirect_stderr, redirect_stdout
from dataclasses import dataclass
from http.server import SimpleHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pytest
import torch
from omegaconf import DictConfig
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tokenizers import ByteLevelBPETokenizer
from torch import nn

from cli.config import composed_train_config, plain_config
from cli.errors import run_cli as cli_entry
from cli.run_spec import run_spec
from data.stories import generate_stories
from data.tokenizer import EOT, CharTokenizer, special_ids
from inspection.head_metrics import induction_probe, induction_score
from inspection.recall_probe import RecallProbe
from model import GPT, CausalSelfAttention, GPTConfig
from model.gpt import eval_mode
from model_io.checkpoint import Checkpoint, upgrade
from model_io.run_files import BEST, kept_checkpoint_path
from runtime.ranks import Ranks
from training.specs import OptimSpec, RunSpec
from training.state import capture_rng_states
from training.tensorboard_log import RunLogger
from user_error import UserError

if TYPE_CHECKING:
    from transformers import GPT2LMHeadModel

ROOT = Path(__file__).resolve().parent.parent
# The project's packages: every folder of it with an __init__.py but the tests' own.
PACKAGES = tuple(sorted(path.parent.name for path in ROOT.glob("*/__init__.py") if path.parent.name != "tests"))
# One process on the CPU, as train.py runs without torchrun: for the in-process pieces (TrainStep, fit).
ONE_PROCESS = Ranks(rank=0, local_rank=0, world_size=1, device=torch.device("cpu"))

# A model and run small enough to train in seconds, touching every logging path.
TINY_RUN = {
    "model.n_layer": 2, "model.n_head": 2, "model.n_embd": 32, "model.block_size": 32,
    "data.n_chars": 20000, "train.max_steps": 20, "train.batch_size": 4,
    "train.eval_interval": 10, "train.eval_iters": 2, "train.log_interval": 5,
    "train.attn_log_interval": 10, "train.sample_interval": 10, "train.sample_tokens": 20,
    "train.probe_tokens": 24, "optim.warmup_steps": 2, "optim.lr": "1e-2", "optim.min_lr": "1e-3",
}


def tiny_run(*presets: dict[str, object], **overrides: object) -> list[str]:
    """TINY_RUN, then each preset, then overrides, as Hydra's key=value overrides: a later value of a
    key replaces the earlier one (Hydra would take the last anyway; here each key is given once), a
    new key is added, and a key given None is left out (a config file's value, or the default, then holds).
    E.g. tiny_run(QUICK, **{"train.max_steps": 40, "hydra.run.dir": "run"})."""
    merged = {key: value for preset in (TINY_RUN, *presets, overrides) for key, value in preset.items()}
    return [f"{key}={str(value).lower() if isinstance(value, bool) else value}" for key, value in merged.items()
            if value is not None]


def tiny_config(*presets: dict[str, object], **overrides: object) -> DictConfig:
    """configs/train.yaml composed in-process with tiny_run(*presets, **overrides)."""
    return composed_train_config(tiny_run(*presets, **overrides))


def tiny_spec(*presets: dict[str, object], **overrides: object) -> RunSpec:
    """tiny_config's run as the frozen spec cli/run_spec.py makes of it: what training/ takes."""
    return run_spec(tiny_config(*presets, **overrides))


def preset_beside_record(record_config: dict, *overrides: str) -> tuple[dict, dict]:
    """configs/ as train.py composes them with these overrides, and a run's config recorded by make
    docs as a checkpoint of that run loads today (with the keys added since, at their old
    behaviour), both as plain values: group by group the same where that run is a run of the preset."""
    preset = plain_config(composed_train_config(list(overrides)))
    return preset, upgrade(Checkpoint(model={}, config=record_config, tokenizer={})).config


def groups_that_differ(preset: dict, record: dict, groups: tuple[str, ...] = ("model", "data", "optim", "tokenizer")) -> list[str]:
    """The groups whose settings differ, cache_dir aside (where each machine keeps its caches)."""
    def settings(group: dict) -> dict:
        return {key: value for key, value in group.items() if key != "cache_dir"}
    return [group for group in groups if settings(preset[group]) != settings(record[group])]


def optim_spec(**changes: object) -> OptimSpec:
    """configs/optim/default.yaml's optimizer (Muon and AdamW) as a spec, with changes."""
    return dataclasses.replace(tiny_spec().optim, **changes)


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


def run_cli(script: str, *args: str, cwd: Path) -> CliResult:
    """`python <script> <args>` (train.py or sample.py) in this process: the same entry point,
    command line and working folder, without a new interpreter's seconds of start-up. An
    exception that would end the process with a traceback gives exit 1 and that traceback."""
    entry = importlib.import_module(script.removesuffix(".py")).main
    return in_this_process(lambda: cli_entry(entry), [script, *args], cwd)


def run_script(path: Path, *args: str, cwd: Path) -> CliResult:
    """`python <path> <args>` in this process, as Python runs a script (__name__ == "__main__"), in
    folder cwd: its exit status and what it printed, without a new interpreter's seconds of start-up."""
    return in_this_process(lambda: runpy.run_path(str(path), run_name="__main__"), [str(path), *args], cwd)


@contextmanager
def fp32_matmuls(precision: str) -> Iterator[None]:
    """torch's fp32 matmul precision ("highest": full fp32, "high": TF32 on CUDA) inside, as it was after."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision(precision)
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def in_this_process(run: Callable[[], object], argv: list[str], cwd: Path) -> CliResult:
    """run() as a process would run it, with argv and in folder cwd: its exit status (1 and the
    traceback for an exception) and what it printed; then argv, sys.path, the folder, the root
    logger's handlers (the run's log file and console) and level, and torch's fp32 matmul
    precision as they were. It starts at a new process's full fp32 matmuls: train.py on CUDA leaves
    TF32 on for the rest of its process, and a later sample.py in a new process would not have it."""
    stdout, stderr = io.StringIO(), io.StringIO()
    saved_argv, saved_path, saved_cwd, saved_handlers = sys.argv, sys.path[:], os.getcwd(), logging.root.handlers[:]
    saved_level = logging.root.level  # train.py sets it to ERROR in a process of rank > 0
    sys.argv = argv
    os.chdir(cwd)
    returncode = 0
    try:
        with redirect_stdout(stdout), redirect_stderr(stderr), fp32_matmuls("highest"):
            run()
    except SystemExit as exit_:
        returncode = exit_.code if isinstance(exit_.code, int) else 1
    except Exception:
        returncode = 1
        stderr.write(traceback.format_exc())
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path
        os.chdir(saved_cwd)
        for handler in set(logging.root.handlers) - set(saved_handlers):
            logging.root.removeHandler(handler)
            handler.close()
        logging.root.setLevel(saved_level)
    return CliResult(returncode, stdout.getvalue(), stderr.getvalue())


def spawn_cli(script: str, *args: str, cwd: Path, timeout: int = 300, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python <script> <args>` as a subprocess: for what only a real process shows (signals,
    a terminal, torchrun, environment variables, the script's own start)."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})}
    return subprocess.run(
        [sys.executable, str(ROOT / script), *args],
        cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout,
    )


def pythonpath_with_root() -> str:
    """PYTHONPATH for a new Python that imports the project from ROOT and still finds the packages
    this one finds through PYTHONPATH (a machine may keep them there rather than in a venv)."""
    return os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])


class QuietHandler(SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # keep the test output clean
        pass


# How the work is shared out does not depend on the tokenizer or the blocks. The torchrun runs
# (test_distributed.py, test_fsdp.py) use char tokens and GPT-2's blocks so that every weight's
# first AdamW step is far from Adam's eps (with a BPE vocabulary some embedding rows, with QK-norm
# some attn.proj weights, get gradients near 1e-8, where float sums in another order move the step
# by 5e-6), and their tolerance of 1e-6 holds.
GPT2_BLOCKS = {"model.pos": "learned", "model.qk_norm": False, "model.mlp": "gelu", "model.smear": False}
# tiny_run(QUICK): char tokens, GPT-2's blocks, no attention maps or samples.
NO_PROBES = {"train.attn_log_interval": 0, "train.sample_interval": 0}  # no maps, head numbers or samples
QUICK = {"tokenizer": "char", **GPT2_BLOCKS, **NO_PROBES}


def torchrun_command(n: int, *args: str, script: tuple[str, ...] = (str(ROOT / "train.py"),)) -> list[str]:
    """python -m torch.distributed.run is the torchrun command: n processes of script on this machine."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={n}", *script, *args]


def torchrun(n: int, *args: str, cwd, timeout: int = 300, preexec_fn=None,
             script: tuple[str, ...] = (str(ROOT / "train.py"),)) -> subprocess.CompletedProcess:
    """torchrun with n processes of script (train.py), run to the end."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(cwd)}
    return subprocess.run(torchrun_command(n, *args, script=script), cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=timeout, preexec_fn=preexec_fn)


# The run of 2 ranks that tests/test_distributed.py and tests/test_fsdp.py compare their stopped,
# killed and sharded runs with (the two_ranks_left_alone fixture). 30 steps of the default optimizer
# (Muon and AdamW) with dropout, so that every RNG matters, the loss logged at each step; 2 micro-steps
# a step (the gradients are synced in the second's backward alone); 3 evaluation batches, so rank 0
# runs 2 and rank 1 one; attention maps and samples (rank 0 alone) at steps 0, 10, 20 and 30. On the
# CPU, as gloo's processes are: on a GPU machine train.device=auto would give each process a GPU of
# its own (a one-GPU machine has none for rank 1).
TWO_RANKS = {**QUICK, "train.device": "cpu", "train.max_steps": 30, "train.log_interval": 1, "train.eval_iters": 3,
             "train.batch_size": 2, "train.grad_accum_steps": 2, "model.dropout": 0.1, "train.attn_log_interval": 10,
             "train.sample_interval": 10}

# train.py as Python runs a script, then the names of the Gloo threads its process still has.
THEN_NAME_GLOO_THREADS = """
import os, runpy, sys
sys.argv = sys.argv[1:]  # train.py and its arguments
sys.path[0] = os.path.dirname(sys.argv[0])
try:
    runpy.run_path(sys.argv[0], run_name="__main__")
finally:
    names = []
    for task in os.listdir("/proc/self/task"):
        try:
            names.append(open(f"/proc/self/task/{task}/comm").read().strip())
        except FileNotFoundError:  # the thread ended after the listing: it is not left
            pass
    print(f"rank {os.environ['RANK']} ended with these gloo threads: {sorted(n for n in names if 'gloo' in n)}")
"""


@dataclass
class Finished:
    """A torchrun run that ended: its run dir and what its processes printed."""
    dir: Path
    stdout: str


@dataclass
class StoppedAndResumed:
    """A torchrun run stopped by Ctrl-C, then resumed to its end: its run dir, the step it stopped
    after, and what each of its two starts printed."""
    dir: Path
    stopped_after: int
    stopped_output: str
    resumed_output: str


def gloo_threads_left(output: str) -> list[tuple[str, str]]:
    """(rank, the Gloo threads it had left) for each process of a run of THEN_NAME_GLOO_THREADS."""
    return sorted(re.findall(r"rank (\d) ended with these gloo threads: (\[.*?\])", output))  # (may share a line)


def two_ranks_left_alone(workdir: Path) -> Finished:
    """TWO_RANKS on 2 processes under DDP, in the default run dir (outputs/<date>/<time>), never
    stopped; each process then names the Gloo threads it has left."""
    wrapper = workdir / "then_name_gloo_threads.py"
    wrapper.write_text(THEN_NAME_GLOO_THREADS)
    result = torchrun(2, *tiny_run(TWO_RANKS), cwd=workdir, script=(str(wrapper), str(ROOT / "train.py")))
    assert result.returncode == 0, result.stdout + result.stderr
    run_dirs = list((workdir / "outputs").glob("*/*"))
    assert len(run_dirs) == 1  # rank 1 made no run dir of its own
    return Finished(run_dirs[0], result.stdout)


def limit_file_size(max_bytes: int) -> Callable[[], None]:
    """A preexec_fn for subprocess: in the child and its children files may grow to max_bytes, then
    writes fail with EFBIG (SIGXFSZ ignored, so the process is not killed), as on a full disk."""
    def limit() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (max_bytes, max_bytes))
    return limit


def signal_after_line(process: subprocess.Popen, marker: str, signum: int, whole_group: bool = False) -> str:
    """Reads the process's output until a line holding marker, sends signum (to its whole process
    group if whole_group), returns all output."""
    seen = []
    for line in process.stdout:
        seen.append(line)
        if marker in line:
            if whole_group:
                os.killpg(process.pid, signum)
            else:
                process.send_signal(signum)
            break
    seen.append(process.stdout.read())
    process.wait(timeout=120)
    return "".join(seen)


def stop_while(process: subprocess.Popen, holds: Callable[[], bool]) -> bool:
    """Stops process (SIGSTOP; waits until the kernel shows it stopped) and says whether holds() is
    true then. If so it stays stopped, and what holds stays true until the test kills it: no race
    between a look and a kill. If not, the process goes on (SIGCONT)."""
    process.send_signal(signal.SIGSTOP)
    stat = Path(f"/proc/{process.pid}/stat")
    while stat.read_text().rsplit(")", 1)[1].split()[0] not in ("T", "t", "Z", "X"):  # the state, after (its name)
        time.sleep(0.001)
    if holds():
        return True
    process.send_signal(signal.SIGCONT)
    return False


def ctrl_c_under_torchrun(n: int, *args: str, cwd: Path, after: str,
                          script: tuple[str, ...] = (str(ROOT / "train.py"),)) -> str:
    """torchrun with n processes of script (train.py), stopped as Ctrl-C in a terminal stops it (SIGINT to
    the whole process group: torchrun and every rank) once it prints a line holding `after`; all it printed."""
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(cwd)}
    process = subprocess.Popen(torchrun_command(n, *args, script=script), cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return signal_after_line(process, after, signal.SIGINT, whole_group=True)


def huge_page_bytes(tensor: torch.Tensor) -> int:
    """The bytes on huge pages (AnonHugePages) of the memory mapping that holds tensor's first
    element, as this process's /proc/self/smaps reports it (Linux only)."""
    address = tensor.data_ptr()
    inside = False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if re.match(r"[0-9a-f]+-[0-9a-f]+ ", line):  # a mapping's first line: its address range
            start, end = (int(bound, 16) for bound in line.split()[0].split("-"))
            inside = start <= address < end
        elif inside and line.startswith("AnonHugePages:"):
            return int(line.split()[1]) * 1024  # kB
    raise AssertionError(f"no mapping of this process holds address {address:#x}")


def moved_to_huge_pages(model: nn.Module) -> bool:
    """Whether model's weights are as move_to_huge_pages leaves them: packed one after another
    from the start of a huge page (torch's own allocator starts none there)."""
    from runtime.huge_pages import HUGE_PAGE, padded, weight_tensors

    tensors = weight_tensors(model)
    first = min(t.data_ptr() for t in tensors)
    end = max(t.data_ptr() + t.nbytes for t in tensors)
    return first % HUGE_PAGE == 0 and end - first <= sum(padded(t.nbytes) for t in tensors)


def weights(run_dir: Path) -> dict[str, torch.Tensor]:
    """The model weights of a run's ckpt_last.pt."""
    return torch.load(run_dir / "ckpt_last.pt", weights_only=True)["model"]


def read_events(path: Path) -> EventAccumulator:
    """A run's TensorBoard events (all the event files of a run dir, or one event file), read whole
    by TensorBoard's own reader: every scalar, image and tensor it holds, none sampled away."""
    return EventAccumulator(str(path), size_guidance={"images": 0, "scalars": 0, "tensors": 0}).Reload()


def text_of(events: EventAccumulator, tag: str) -> str:
    """The first text logged under tag, without RunLogger's 4-space code-block indent."""
    return events.Tensors(f"{tag}/text_summary")[0].tensor_proto.string_val[0].decode()[4:]


def curves(events: EventAccumulator) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag's (step, value) pairs."""
    return {tag: [(e.step, e.value) for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}


def last_values(events: EventAccumulator, tags) -> dict[str, float]:
    """The value each scalar tag logged last."""
    return {tag: events.Scalars(tag)[-1].value for tag in tags}


def recomputed_last_step_scalars(run_dir: Path) -> dict[str, float]:
    """The induction, recall and ablation scalars of a run's last step, computed afresh from its
    ckpt_last.pt: the held-out stories (data.seed + 1) and the induction probe of train.seed, as the
    run builds them; name recall without each head the plain way, head by head."""
    checkpoint = Checkpoint.load(run_dir / "ckpt_last.pt")
    cfg, (model, tokenizer) = checkpoint.config, checkpoint.build_model()
    n = min(cfg["train"]["probe_tokens"], cfg["model"]["block_size"]) // 2
    probe = torch.tensor([induction_probe(tokenizer.vocab_size, n, cfg["train"]["seed"], avoid=special_ids(tokenizer))])
    induction = induction_score(model.attention_weights(probe)[:, 0], n)  # (L, H)
    recall_probe = RecallProbe.build(tokenizer, cfg["model"]["block_size"], seed=cfg["data"]["seed"] + 1)
    recall = recall_probe.evaluate(model)
    per_head = {f"{prefix}/layer_{layer}/head_{head}": values[layer, head].item()
                for prefix, values in (("head_induction", induction), ("recall_heads", recall.head_weight))
                for layer, head in np.ndindex(*values.shape)}
    by_kind = {f"recall/accuracy_{kind}": value for kind, value in recall.accuracy_by_kind.items()}
    ablation = {}
    for layer, head in np.ndindex(*induction.shape):
        with model.hooks(model.knock_out({(layer, head)})):
            ablation[f"ablation/recall_name/layer_{layer}/head_{head}"] = recall_probe.evaluate(model).accuracy_by_kind["name"]
    return {**per_head, "recall/accuracy": recall.accuracy, **by_kind, **ablation}


def logged_losses(stdout: str) -> list[float]:
    """The train and val losses of each evaluation, in the order train.py printed them."""
    return [float(v) for pair in re.findall(r"step \d+: train loss ([\d.]+), val loss ([\d.]+)", stdout) for v in pair]


def one_line_error(call: Callable[..., object], *args: object, **kwargs: object) -> str:
    """The message of the UserError call(*args, **kwargs) raises, checked to be one line."""
    with pytest.raises(UserError) as raised:
        call(*args, **kwargs)
    assert "\n" not in str(raised.value)
    return str(raised.value)


def max_logit_gap(ours: GPT, theirs: nn.Module, idx: torch.Tensor) -> float:
    """The largest difference between our logits and a transformers model's on idx (B, T), ours in eval mode."""
    with torch.no_grad(), eval_mode(ours):
        return (ours(idx)[0] - theirs(idx).logits).abs().max().item()


def assert_one_error_line(result, message: str) -> None:
    """A refusal as the user sees it: exit status 2, one line on stderr that holds message, no traceback."""
    assert result.returncode == 2, result.stdout + result.stderr
    assert result.stderr.strip().splitlines() == [result.stderr.strip()], result.stderr  # one line
    assert message in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


# The whole corpus tokenised at once, as simply as it can be said: what the stream
# (data/token_stream.py) must give, id for id.
def split_documents(documents: list[str], val_fraction: float) -> tuple[list[str], list[str], bool]:
    """Cut the corpus, read as one text, so the last val_fraction of its characters is val.
    The cut may fall inside a document: then its tail starts the val split, and the third
    value is True (that tail does not start a document)."""
    total = sum(len(doc) for doc in documents)
    remaining = total - int(total * val_fraction)  # characters that go to train
    for i, doc in enumerate(documents):
        if remaining < len(doc):
            head, tail = doc[:remaining], doc[remaining:]
            train = documents[:i] + ([head] if head else [])
            return train, [tail, *documents[i + 1 :]], bool(head)
        remaining -= len(doc)
    return documents, [], False


def encode_documents(tokenizer, documents: list[str], starts_mid_document: bool = False) -> list[int]:
    """<|endoftext|> doc <|endoftext|> doc ...; a leading piece that continues a document cut in
    two gets no token before it."""
    ids: list[int] = []
    for i, doc in enumerate(documents):
        if not (i == 0 and starts_mid_document):
            ids.append(tokenizer.eot_id)
        ids.extend(tokenizer.encode(doc))
    return ids


def made_up_attention(seed: int, n_layer: int, n_head: int, T: int) -> torch.Tensor:
    """Causal attention weights (n_layer, n_head, T, T) from random scores: what a model of that
    shape would log, without training one."""
    scores = torch.randn(n_layer, n_head, T, T, generator=torch.Generator().manual_seed(seed)) * 3
    return scores.masked_fill(torch.ones(T, T).triu(1).bool(), float("-inf")).softmax(-1)


def tiny_gpt(vocab_size: int = 65, block_size: int = 16, seed: int = 0, **overrides) -> GPT:
    """A randomly initialised GPT of 2 layers, 2 heads and 32 channels; overrides set any GPTConfig field."""
    torch.manual_seed(seed)
    config = dict(vocab_size=vocab_size, block_size=block_size, n_layer=2, n_head=2, n_embd=32)
    return GPT(GPTConfig(**{**config, **overrides}))


def lively(model: GPT) -> GPT:
    """model with its matrices redrawn from N(0, 0.5): at the init's 0.02 every logit is near 0 and
    greedy tokens hardly depend on the context; at 0.5 they do, so a wrong key or value shows."""
    torch.manual_seed(1)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0.0, 0.5)
    return model.eval()


# Every architecture option (model.pos, norm, mlp, tie_head, qk_norm) against the GPT-2 defaults.
ARCHITECTURE_OPTIONS = [{}, {"pos": "rope"}, {"norm": "rmsnorm"}, {"mlp": "relu2"}, {"tie_head": False}, {"qk_norm": True},
                        {"smear": True},
                        {"pos": "rope", "norm": "rmsnorm", "mlp": "relu2", "tie_head": False, "qk_norm": True, "smear": True},
                        # Today's small models: one key/value head for both query heads, SwiGLU, a window.
                        {"pos": "rope", "norm": "rmsnorm", "mlp": "swiglu", "qk_norm": True, "n_kv_head": 1, "window": 5}]


def previous_token_copier(attention: str) -> GPT:
    """A 1-layer, 2-head GPT with weights set by hand: head 0 copies the previous token, head 1
    averages the tokens so far, and the LM head predicts whatever head 0 copied. The 24 channels
    of the residual stream: [0, 8) this token, [8, 16) this position (both one-hot), and
    [16, 24) the previous token, written there by head 0."""
    V = T = 8  # vocabulary and block_size
    TOKEN, POSITION, PREVIOUS = 0, 8, 16  # where each group of channels starts
    model = GPT(GPTConfig(vocab_size=V, block_size=T, n_layer=1, n_head=2, n_embd=24, attention=attention,
                          norm="rmsnorm", tie_head=False))  # RMSNorm: a pure rescaling; no biases
    block, D = model.blocks[0], model.blocks[0].attn.head_dim  # D = 12
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.zero_()  # the MLP stays zero: an attention-only model
        model.tok_emb.weight[:, TOKEN : TOKEN + V] = torch.eye(V)
        model.pos_emb.weight[:, POSITION : POSITION + T] = torch.eye(T)
        block.ln_1.weight.fill_(math.sqrt(2 / 24))  # every stream holds two ones: this undoes RMSNorm's 1 / RMS
        q, k, v = block.attn.qkv.weight.split(24)  # (C, C) each; head 0 owns rows [0, D), head 1 rows [D, 2D)
        # Head 0: query t is position t, times 100; key s is position s + 1. They meet only for
        # s = t - 1, with a score of 100 / sqrt(D) ~ 29: all the weight on the previous token.
        q[:T, POSITION : POSITION + T] = 100 * torch.eye(T)
        k[1:T, POSITION : POSITION + T - 1] = torch.eye(T - 1)
        v[:V, TOKEN : TOKEN + V] = torch.eye(V)  # and what it takes from there is the token
        v[D : D + V, TOKEN : TOKEN + V] = torch.eye(V)  # head 1: no query or key, so equal weights
        proj = block.attn.proj.weight  # (C, C): columns [0, D) read head 0, [D, 2D) head 1
        proj[PREVIOUS : PREVIOUS + V, :V] = torch.eye(V)  # head 0 writes the previous token
        proj[TOKEN : TOKEN + V, D : D + V] = torch.eye(V)  # head 1 writes where the LM head does not read
        model.ln_f.weight.fill_(1.0)
        model.lm_head.weight[:, PREVIOUS : PREVIOUS + V] = 10 * torch.eye(V)  # predict the previous token
    return model.eval()


def multihead_attention_like(module: CausalSelfAttention) -> nn.MultiheadAttention:
    """torch's nn.MultiheadAttention with the module's weights (the same [W_q; W_k; W_v] layout)."""
    C = module.proj.weight.shape[0]
    mha = nn.MultiheadAttention(C, module.n_head, batch_first=True)
    with torch.no_grad():
        mha.in_proj_weight.copy_(module.qkv.weight)
        mha.in_proj_bias.copy_(module.qkv.bias)
        mha.out_proj.weight.copy_(module.proj.weight)
        mha.out_proj.bias.copy_(module.proj.bias)
    return mha


# A trained GPT-2's scale rather than HF's init (0.02 everywhere): logits of a few units, and GELU
# inputs around 1, where its tanh form is ~1e-4 off erf's (near 0 the two agree).
WEIGHT_STDS = {"wte.weight": 0.3, "mlp.c_fc.weight": 0.3, "mlp.c_proj.weight": 0.2}
HARD_TEXT = ("Café naïve, Straße, 日本語 and 🙂👍🏽 emoji\n\n\ttabs\t\tand   runs of    spaces \r\n"
             "digits 1234567890 and 3.14, don't 'quote' it , so . it is ! is it ? it 's do n't \n")


TINY_GPT2_VOCAB = 301  # tiny_gpt2's vocabulary unless told: <|endoftext|> is its last id


def tiny_gpt2(seed: int = 0, vocab_size: int = TINY_GPT2_VOCAB, eot_id: int = TINY_GPT2_VOCAB - 1,
              n_positions: int = 64, **options) -> "GPT2LMHeadModel":
    """A random GPT2LMHeadModel with GPT-2's settings (tanh GELU, eps 1e-5, biases) at a tiny size;
    its LayerNorms perturbed away from 1 and 0 so that a lost or swapped one shows."""
    # Imported here, not at the top: conftest.py imports this module, and pytest-xdist's controller
    # imports conftest.py before it starts the workers, so two seconds of transformers there
    # delayed every test (the workers import it anyway, with the test files that use it).
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(seed)
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, n_positions=n_positions, vocab_size=vocab_size,
                        activation_function="gelu_new", bos_token_id=eot_id, eos_token_id=eot_id, **options)
    model = GPT2LMHeadModel(config).eval()
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            std = next((std for suffix, std in WEIGHT_STDS.items() if name.endswith(suffix)), None)
            if ".ln_" in name:
                parameter.add_(0.3 * torch.randn_like(parameter))
            elif std is not None:
                parameter.normal_(0, std)
            elif name.endswith("bias"):
                parameter.normal_(0, 0.02)
    return model


def tiny_bpe_folder(folder: Path, vocab_size: int = 400) -> ByteLevelBPETokenizer:
    """A byte-level BPE trained by `tokenizers` on the built-in stories, <|endoftext|> first (id 0),
    saved in GPT-2's layout (vocab.json, merges.txt) and as tokenizer.json."""
    trained = ByteLevelBPETokenizer()
    stories = "".join(generate_stories(seed=11, n_chars=30_000))
    trained.train_from_iterator([stories, HARD_TEXT], vocab_size=vocab_size, special_tokens=[EOT], show_progress=False)
    folder.mkdir(parents=True, exist_ok=True)
    trained.save(str(folder / "tokenizer.json"))
    trained.save_model(str(folder))
    return trained


def tiny_gpt2_folder(folder: Path, seed: int = 0, n_positions: int = 64) -> Path:
    """A whole Hugging Face GPT-2 folder, as init_from reads one: a tiny random model
    (model.safetensors, config.json) and its tiny BPE (vocab.json, merges.txt, tokenizer.json)."""
    trained = tiny_bpe_folder(folder)
    eot_id = trained.token_to_id(EOT)
    tiny_gpt2(seed, vocab_size=trained.get_vocab_size(), eot_id=eot_id, n_positions=n_positions).save_pretrained(folder)
    return folder


PREVIOUS_TOKEN_HEAD, INDUCTION_HEAD = (0, 0), (1, 0)  # (layer, head) in shift_then_copy_model


@torch.no_grad()
def shift_then_copy_model(vocab_size: int = 64, block_size: int = 32) -> GPT:
    """Two layers of two heads; head 0 of layer 0 writes each token's predecessor into the
    residual stream (a previous-token head), head 0 of layer 1 looks for the key whose
    predecessor is the current token and copies that key's token to the output (an induction
    head). The other heads and the MLPs write nothing. The residual stream is four one-hot
    blocks: [token | previous token | copied token | position]."""
    C = 3 * vocab_size + block_size
    config = GPTConfig(vocab_size, block_size, n_layer=2, n_head=2, n_embd=C, pos="learned", norm="rmsnorm",
                       mlp="gelu", tie_head=False, qk_norm=False, smear=False)
    model = GPT(config).eval()
    for parameter in model.parameters():
        parameter.zero_()
    for norm in (model.ln_f, *[block.ln_1 for block in model.blocks], *[block.ln_2 for block in model.blocks]):
        norm.weight.fill_(1.0)
    D = C // 2  # head_dim
    token, previous, copied, position = (torch.arange(vocab_size), vocab_size + torch.arange(vocab_size),
                                         2 * vocab_size + torch.arange(vocab_size), 3 * vocab_size + torch.arange(block_size))
    model.tok_emb.weight[torch.arange(vocab_size), token] = 1.0
    model.pos_emb.weight[torch.arange(block_size), position] = 1.0
    # RMSNorm scales a stream of m one-hot blocks by sqrt(C / m): the weights below undo it, so that
    # each value is a one-hot of 1 and a matching query and key score `sharp` (any other pair 0).
    sharp = 30.0
    # Layer 0 (the stream: token, position), head 0: the query at position t matches the key at
    # t - 1, and moves that key's token into `previous`.
    qkv, proj = model.blocks[0].attn.qkv.weight, model.blocks[0].attn.proj.weight  # (3C, C), (C, C)
    qkv[torch.arange(block_size), position] = sharp * math.sqrt(D) / (C / 2)  # W_q: position t -> query dim t
    qkv[C + torch.arange(1, block_size), position[:-1]] = 1.0  # W_k: position s -> key dim s + 1
    qkv[2 * C + torch.arange(vocab_size), token] = math.sqrt(2 / C)  # W_v: the token
    proj[previous, torch.arange(vocab_size)] = 1.0
    # Layer 1 (token, position, previous), head 0: the query holds the current token, a key its
    # own predecessor; the value is the key's token, written into `copied`.
    qkv, proj = model.blocks[1].attn.qkv.weight, model.blocks[1].attn.proj.weight
    qkv[torch.arange(vocab_size), token] = sharp * math.sqrt(D) / (C / 3)
    qkv[C + torch.arange(vocab_size), previous] = 1.0
    qkv[2 * C + torch.arange(vocab_size), token] = math.sqrt(3 / C)
    proj[copied, torch.arange(vocab_size)] = 1.0
    model.lm_head.weight[torch.arange(vocab_size), copied] = 12.0 / math.sqrt(C / 4)  # the copied token's logit: 12
    return model


CIRCUIT_TOKENIZER = CharTokenizer(list(string.ascii_letters + string.digits + "."))  # 63 characters, <|endoftext|> 63
CIRCUIT_BLOCK_SIZE = 40  # <eot> and up to 19 tokens twice
CIRCUIT_N = 16  # random tokens, then the same 16 again: 33 tokens with <eot>
# A seed whose 16 tokens all differ: a token twice in the first copy has two earlier occurrences,
# and even an ideal induction head splits its weight between the tokens after them.
CIRCUIT_SEED = next(seed for seed in range(100) if len(set(
    induction_probe(CIRCUIT_TOKENIZER.vocab_size, CIRCUIT_N, seed, special_ids(CIRCUIT_TOKENIZER))[:CIRCUIT_N])) == CIRCUIT_N)


def save_circuit(run_dir: Path) -> GPT:
    """shift_then_copy_model as a run's checkpoint, beside an event file (TensorBoard lists the run)."""
    model = shift_then_copy_model(CIRCUIT_TOKENIZER.vocab_size, CIRCUIT_BLOCK_SIZE)
    shape = {key: value for key, value in dataclasses.asdict(model.config).items() if key != "vocab_size"}
    run_dir.mkdir()
    Checkpoint(model.state_dict(), {"model": shape}, CIRCUIT_TOKENIZER.state(), step=0).save(run_dir / BEST)
    logger = RunLogger(run_dir)
    logger.scalars(0, {"loss/train": 4.2})
    logger.close()
    return model


def keep_circuit_checkpoints(run_dir: Path, steps: tuple[int, int] = (0, 100)) -> dict[int, GPT]:
    """Two checkpoints of the circuit a run keeps along the way (train.keep_checkpoints), as if it
    had learnt it: at the first step its induction head has not formed (its queries are zero, so
    it looks at every earlier token alike), at the second it is shift_then_copy_model whole."""
    before, after = (shift_then_copy_model(CIRCUIT_TOKENIZER.vocab_size, CIRCUIT_BLOCK_SIZE) for _ in steps)
    C = before.config.n_embd
    with torch.no_grad():
        before.blocks[1].attn.qkv.weight[:C] = 0.0  # W_q of layer 1
    shape = {key: value for key, value in dataclasses.asdict(after.config).items() if key != "vocab_size"}
    for step, model in zip(steps, (before, after), strict=True):
        path = kept_checkpoint_path(run_dir, step)
        path.parent.mkdir(parents=True, exist_ok=True)
        Checkpoint(model.state_dict(), {"model": shape}, CIRCUIT_TOKENIZER.state(), step=step).save(path)
    return dict(zip(steps, (before, after), strict=True))


def small_checkpoint(tmp_path, name="ckpt_last.pt", text="abc \n"):
    """A checkpoint of a 1-layer model of random weights that reads the characters of text, written
    to tmp_path/name: (its path, the model)."""
    tokenizer = CharTokenizer.from_text(text)
    model_cfg = dict(n_layer=1, n_head=2, n_embd=8, block_size=8, dropout=0.0, bias=False, attention="sdpa")
    model = GPT(GPTConfig(vocab_size=tokenizer.vocab_size, **model_cfg))
    optimizer = torch.optim.AdamW(model.parameters())
    path = tmp_path / name
    Checkpoint(model=model.state_dict(), optimizer=optimizer.state_dict(), step=7, best_val_loss=1.5,
               config={"model": model_cfg}, tokenizer=tokenizer.state(),
               run_state={"rng": capture_rng_states(np.random.default_rng(0))}).save(path)
    return path, model


# What a test module's logdir fixture (tests/conftest.py) holds: the module lists builders such as
# these in LOGDIR, and each puts its runs into the logdir given.
LogdirBuilder = Callable[[Path, pytest.FixtureRequest], None]


def whole_tiny_run(logdir: Path, request: pytest.FixtureRequest) -> None:
    """The tiny run (trained_run) as "run", with its best checkpoint kept as if at step 10 too."""
    trained_run = request.getfixturevalue("trained_run")
    shutil.copytree(trained_run, logdir / "run")
    kept = Checkpoint.load(trained_run / BEST)
    kept.step = 10
    kept_checkpoint_path(logdir / "run", 10).parent.mkdir(exist_ok=True)
    kept.save(kept_checkpoint_path(logdir / "run", 10))


def tiny_run_events(logdir: Path, request: pytest.FixtureRequest) -> None:
    """The tiny run as "run": its event file and best checkpoint alone."""
    trained_run = request.getfixturevalue("trained_run")
    (logdir / "run").mkdir()
    for events in [*trained_run.glob("events.out.tfevents.*"), trained_run / BEST]:
        shutil.copy(events, logdir / "run")


def young_run(logdir: Path, request: pytest.FixtureRequest) -> None:
    """"young": a run that has logged a scalar and saved no checkpoint yet (so no attention data either)."""
    young = RunLogger(logdir / "young")
    young.scalars(0, {"loss/train": 7.0})
    young.close()


def made_up_runs(logdir: Path, request: pytest.FixtureRequest) -> None:
    """Runs of made-up weights: "big", a 12 x 12 model on 128 tokens; "uniform", heads that weigh every
    visible token the same; "windowed", the same within a window of 3 (each query sees its 3 most
    recent keys); "a-trained", the only one that trained 100 steps (to step 150)."""
    big = RunLogger(logdir / "big")
    for step in (0, 5, 10):
        big.attention_weights(step, made_up_attention(step, 12, 12, 128), [f"t{i}" for i in range(128)])
    big.close()
    uniform = RunLogger(logdir / "uniform")
    uniform.attention_weights(0, torch.ones(2, 2, 6, 6).tril() / torch.arange(1, 7).view(6, 1), list("abcdef"))
    uniform.close()
    windowed = RunLogger(logdir / "windowed")
    band = torch.ones(6, 6).tril() - torch.ones(6, 6).tril(-3)  # (6, 6): 1 on the 3 most recent keys
    windowed.attention_weights(0, (band / band.sum(-1, keepdim=True)).expand(2, 2, 6, 6), list("abcdef"), window=3)
    windowed.close()
    trained = RunLogger(logdir / "a-trained")
    trained.scalars(150, {"loss/train": 2.0})
    trained.attention_weights(150, made_up_attention(150, 2, 2, 6), list("abcdef"))
    trained.close()


def circuit_run(logdir: Path, request: pytest.FixtureRequest) -> None:
    """"circuit": the induction circuit built by hand, saved as a checkpoint, and kept at step 0
    (before its induction head formed) and at step 100."""
    save_circuit(logdir / "circuit")
    keep_circuit_checkpoints(logdir / "circuit")


def circuit_run_with_maps(logdir: Path, request: pytest.FixtureRequest) -> None:
    """circuit_run, and its attention maps on repeated tokens logged at step 0."""
    circuit = save_circuit(logdir / "circuit")
    keep_circuit_checkpoints(logdir / "circuit")
    ids = [CIRCUIT_TOKENIZER.eot_id, *induction_probe(CIRCUIT_TOKENIZER.vocab_size, 8, 0, special_ids(CIRCUIT_TOKENIZER))]
    logger = RunLogger(logdir / "circuit")
    logger.attention_weights(0, circuit.attention_weights(torch.tensor([ids]))[:, 0], CIRCUIT_TOKENIZER.token_strings(ids))
    logger.close()


def hydra_run_folders(logdir: Path, request: pytest.FixtureRequest) -> None:
    """Empty outputs/<date>/<time> and multirun/<date>/<time>/0 run folders, a folder "secret" beside
    them, and outputs/outputs-escape, a link out of outputs to the secret."""
    for run in ("outputs/2026-01-02/03-04-05", "multirun/2026-01-02/03-04-05/0"):
        (logdir / run).mkdir(parents=True)
    (logdir / "secret").mkdir()
    (logdir / "outputs" / "outputs-escape").symlink_to(logdir / "secret")


def streamed_pieces(tokenizer, ids: list[int], eot_text: str | None, whole: str) -> list[str]:
    """The pieces a TextStream hands on as ids (the start token first) come one at a time, then
    the rest once the text is whole."""
    from model.generation import TextStream
    pieces: list[str] = []
    stream = TextStream(tokenizer, 1, eot_text, pieces.append)
    for end in range(2, len(ids) + 1):
        stream(torch.tensor([ids[:end]]))
    stream.finish(whole)
    return pieces
