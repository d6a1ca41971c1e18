"""What the loop does every so many steps, besides training and saving (training/saving.py): each job
says when it is due."""

import logging
import math

import torch

from data.batches import probe_ids
from data.tokenizer import special_ids
from inspection.ablation import induction_loss_without_each_head, recall_without_each_head
from inspection.head_metrics import head_metrics, induction_score, run_induction_probe
from inspection.recall_probe import RecallProbe
from model.generation import EOT_SHOWN, generate_text, terminal_text
from training.build import Run
from training.evaluation import evaluate
from training.state import TrainState
from training.tensorboard_log import IN_CONTEXT_LOSS, RunLogger, loss_tag

log = logging.getLogger("train")

# The recall probe reads at most 96 windows, and at most this many tokens of held-out stories
# (96 windows of the default 128; 12 of GPT-2's 1,024), and
# the ablations, a probe's forward per knocked-out head, run for models of at most this many heads:
# at GPT-2 small's 144 heads of 1,024 tokens they would take hours on a CPU at every attention step.
RECALL_PROBE_WINDOWS, RECALL_PROBE_TOKENS = 96, 96 * 128
ABLATION_MAX_HEADS = 64
INDUCTION_ROWS = 8  # repeated random sequences whose second copies the induction ablation scores


class Every:
    """Due every interval steps and at the last step; interval 0: never. at_start=False
    leaves out step 0."""

    def __init__(self, interval: int, at_start: bool = True) -> None:
        self.interval, self.at_start = interval, at_start

    def __call__(self, step: int, last: bool) -> bool:
        if not self.interval:
            return False
        return (step % self.interval == 0 and (step > 0 or self.at_start)) or last


class Evaluation:
    """Train and val loss (val alone with train.eval_train=false) and the in-context score, to
    TensorBoard; the losses to the log."""

    def __init__(self, run: Run, tb: RunLogger) -> None:
        self.run, self.tb = run, tb
        self.due = Every(run.spec.loop.eval_interval, at_start=run.spec.loop.eval_at_start)
        self.history: list[dict[str, float]] = []  # {"step", "train", "val"} of every evaluation ("train" only with eval_train)

    def __call__(self, state: TrainState) -> None:
        run, loop, step = self.run, self.run.spec.loop, self.run.spec.step
        splits = ("train", "val") if loop.eval_train else ("val",)
        evaluated = evaluate(run.eval_model, run.data, step.batch_size, step.block_size, loop.eval_iters,
                             run.ranks, run.precision, loop.seed, splits, lockstep=run.parallel.collective_forwards)
        losses = evaluated.losses
        self.tb.scalars(state.step, {loss_tag(split): loss for split, loss in losses.items()})
        if evaluated.in_context is not None:
            self.tb.scalars(state.step, {IN_CONTEXT_LOSS: evaluated.in_context})
        log.info(f"step {state.step}: " + ", ".join(f"{split} loss {loss:.4f}" for split, loss in losses.items()))
        self.history.append({"step": state.step, **losses})

    def val_loss_at(self, step: int) -> float:
        """The val loss of this step's evaluation; inf where it had none."""
        return self.history[-1]["val"] if self.history and self.history[-1]["step"] == step else math.inf


class AttentionMaps:
    """Rank 0: the probe text's attention maps, drawn from the weights the model uses right now,
    and what each head does in numbers (on the probe, the induction probe and the recall probe),
    and with each head knocked out alone: the recall probe's name recall, and the loss on the
    second copy of repeated random tokens. Due on every rank: under FSDP every rank gathers the
    whole model for it."""

    def __init__(self, run: Run, tb: RunLogger, fresh: bool) -> None:
        probes, shape, tokenizer, device = run.spec.probes, run.model.config, run.data.tokenizer, run.ranks.device
        self.model, self.tb, self.parallel, self.is_main = run.model, tb, run.parallel, run.ranks.is_main
        self.due = Every(probes.attn_log_interval, at_start=probes.attn_log_at_start)
        self.last_recall: tuple[int, dict[str, float]] | None = None  # (step, accuracy by kind): the probe's latest
        n_probe = min(probes.probe_tokens, shape.block_size)
        probe = probe_ids(run.data.val, tokenizer, n_probe)
        self.probe = torch.tensor([probe], device=device)  # (1, T_probe)
        self.labels = tokenizer.token_strings(probe)
        if fresh:
            tb.probe_tokens(self.labels)
        # Random tokens, repeated once (see inspection/head_metrics.py): the first row's attention
        # gives the induction scores, all rows the loss on the second copy that the ablation reads.
        repeated = run_induction_probe(tokenizer.vocab_size, probes.probe_tokens, shape.block_size, probes.seed,
                                       avoid=special_ids(tokenizer), rows=INDUCTION_ROWS)  # (INDUCTION_ROWS, 2n) or None
        self.repeated = repeated.to(device) if repeated is not None else None
        self.induction = self.repeated[:1] if self.repeated is not None else None  # (1, 2n)
        # Held-out stories (another seed), where names and items come back.
        max_windows = min(RECALL_PROBE_WINDOWS, max(1, RECALL_PROBE_TOKENS // shape.block_size))
        self.recall = (RecallProbe.build(tokenizer, shape.block_size, seed=probes.recall_seed, max_windows=max_windows)
                       if self.due.interval and probes.recall_seed is not None and self.is_main else None)
        if self.recall is not None and not self.recall.targets:
            self.recall = None  # block_size too short for a name to come back inside one window
        n_heads = shape.n_layer * shape.n_head
        self.ablate = n_heads <= ABLATION_MAX_HEADS
        if not self.ablate and fresh and self.due.interval:
            log.info(f"note: no ablation/... scalars: this model has {n_heads} heads, and knocking each out alone "
                     f"costs a probe's forward per head (they run for at most {ABLATION_MAX_HEADS} heads)")

    def __call__(self, state: TrainState) -> None:
        with self.parallel.whole_model():
            if self.is_main:
                self.draw(state)

    def draw(self, state: TrainState) -> None:
        weights = self.model.attention_weights(self.probe)[:, 0]  # (L, H, T, T)
        window = self.model.config.window
        self.tb.attention_maps(state.step, weights, self.labels, window)
        self.tb.head_grid(state.step, weights, window)
        self.tb.attention_weights(state.step, weights, self.labels, window)
        metrics = head_metrics(weights)
        if self.induction is not None:
            induction_weights = self.model.attention_weights(self.induction)[:, 0]  # (L, H, 2n, 2n)
            metrics["induction"] = induction_score(induction_weights, self.induction.shape[1] // 2)
        self.tb.head_metrics(state.step, metrics)
        if self.repeated is not None and self.ablate:
            self.tb.induction_ablation(state.step, induction_loss_without_each_head(self.model, self.repeated))
        if self.recall is not None:
            scores = self.recall.evaluate(self.model)
            self.tb.recall(state.step, scores)
            self.last_recall = (state.step, scores.accuracy_by_kind)
            if "name" in scores.accuracy_by_kind and self.ablate:
                self.tb.ablation(state.step, recall_without_each_head(self.model, self.recall, "name"))


class Samples:
    """Rank 0: a generated sample, to read how the model writes. Due on every rank: under FSDP
    every rank gathers the whole model for it."""

    def __init__(self, run: Run, tb: RunLogger) -> None:
        self.run, self.tb = run, tb
        probes = run.spec.probes
        self.due = Every(probes.sample_interval if probes.sample_tokens else 0)  # either one 0: no samples

    def __call__(self, state: TrainState) -> None:
        with self.run.parallel.whole_model():
            if self.run.ranks.is_main:
                self.write(state)

    def write(self, state: TrainState) -> None:
        probes = self.run.spec.probes
        try:
            sample = generate_text(self.run.model, self.run.data.tokenizer, "", probes.sample_tokens,
                                   temperature=probes.sample_temperature, seed=probes.seed, eot_text=EOT_SHOWN)[0]
        except FloatingPointError as error:  # only after train.skip_nonfinite let NaN in
            sample = f"(no sample: {error})"
        self.tb.text("samples", sample, state.step)
        log.info(f"sample at step {state.step}:\n{terminal_text(sample)}\n")
