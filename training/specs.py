"""What a training run is asked for, as frozen values: cli/run_spec.py builds one RunSpec from the
composed config once, and nothing below cli/ reads the config itself (no Hydra, no OmegaConf
there). Each spec is the part one room of the run needs; what each value means, and its
default, is said once, in configs/.

    model      the network's shape: model/gpt.py's GPTConfig (vocab_size: the tokenizer's, later)
    corpus     the text, and tokenizer: how it becomes ids (data/specs.py)
    optim      the optimizer and its learning-rate schedule
    step       what one update is made of: the batch, its micro-steps, clipping, the non-finite policy
    loop       how long to train, and when to evaluate, log and save
    probes     what the run looks at besides the loss: attention maps and head metrics, the recall
               probe, samples
    device     where and how it computes: device, precision, compiled or not, DDP or FSDP
    start      where it starts from: random weights, or init_from's
    debug      debug=shapes: the shape walk instead of a run
"""

from dataclasses import dataclass
from pathlib import Path

from data.specs import CorpusSpec, TokenizerSpec
from model.gpt import GPTConfig


@dataclass(frozen=True)
class OptimSpec:
    name: str  # adamw, or muon (training/optimizer.py)
    lr: float
    min_lr: float
    schedule: str  # cosine or wsd (training/lr_schedule.py)
    decay_fraction: float
    warmup_steps: int
    weight_decay: float
    betas: tuple[float, float]
    muon_momentum: float
    ns_dtype: str  # auto, float32 or bfloat16


@dataclass(frozen=True)
class StepSpec:
    batch_size: int  # sequences per micro-step, on each process
    block_size: int  # tokens per sequence
    grad_accum_steps: int  # micro-steps per update
    grad_clip: float  # the largest gradient norm; 0: no clipping
    skip_nonfinite: bool  # skip a batch whose loss or gradient is not finite, instead of stopping


@dataclass(frozen=True)
class LoopSpec:
    max_steps: int
    seed: int  # train.seed: the first weights, dropout, the batches' draw, the evaluation's batches
    eval_interval: int
    eval_iters: int
    eval_at_start: bool
    eval_train: bool  # evaluate the train split too, not only val
    log_interval: int
    save_interval: int  # 0: save only at evaluations
    keep_checkpoints: tuple[int, ...] | str  # steps of model-only checkpoints, or "log"


@dataclass(frozen=True)
class ProbeSpec:
    attn_log_interval: int  # 0: no maps, head metrics or ablations
    attn_log_at_start: bool  # False: none at step 0 either
    probe_tokens: int
    seed: int  # train.seed too: the induction probe's random tokens, and the samples' draws
    recall_seed: int | None  # the held-out stories of the recall probe; None: no recall probe (not the stories)
    sample_interval: int  # 0: no samples
    sample_tokens: int
    sample_temperature: float


@dataclass(frozen=True)
class DeviceSpec:
    device: str  # auto, cpu, cuda, cuda:1, mps
    dtype: str  # auto, fp32, bf16, fp16 (runtime/precision.py)
    compile: bool
    parallel: str  # ddp or fsdp, under torchrun


@dataclass(frozen=True)
class StartSpec:
    init_from: str | None  # as given: a folder or a Hub id
    weights: Path | None  # the Hugging Face folder a new run loads its weights from; None: random (or a resumed run's)


@dataclass(frozen=True)
class RunSpec:
    model: GPTConfig
    corpus: CorpusSpec
    tokenizer: TokenizerSpec
    optim: OptimSpec
    step: StepSpec
    loop: LoopSpec
    probes: ProbeSpec
    device: DeviceSpec
    start: StartSpec
    debug: str | None = None  # shapes: print every tensor's shape through one forward instead of training
