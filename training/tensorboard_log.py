"""Everything a run writes to TensorBoard, under fixed tag names:

    loss/train, loss/val                  mean losses at each evaluation (loss/train: unless eval_train=false)
    train/batch_loss, train/lr, train/grad_norm, train/tokens_per_sec   every log_interval steps
    train/loss_scale                      fp16's loss scale (train.dtype=fp16), at the same steps
    train/skipped_nonfinite               updates skipped: an fp16 overflow, or a NaN/inf (train.skip_nonfinite)
    attention/layer_{l}/head_{h}          heatmaps of the probe text, every attn_log_interval steps
    attention/all_heads                   every head of every layer in one image, at the same steps
    attention/weights                     the same weights as numbers, (n_layer, n_head, T, T) in float16,
                                          with the probe's token labels: the Attention tab's data
    head_{metric}/layer_{l}/head_{h}      entropy, distance, previous_token and induction of each
                                          head (inspection/head_metrics.py), at the same steps
    attention/probe                       the probe's tokens, as the heatmaps label them, once
    samples                               generated text, every sample_interval steps
    config                                the run's resolved config (YAML), once
    recall/accuracy, recall/accuracy_name, recall/accuracy_item   the recall probe (stories corpus:
                                          inspection/recall_probe.py), at the attention steps
    recall_heads/layer_{l}/head_{h}       each head's weight on the earlier mention there
    recall/top_heads                      the heads that look back at it most (text)
    ablation/recall_name/layer_{l}/head_{h}   recall/accuracy_name with that head knocked out alone
                                          (inspection/ablation.py), at the same steps
    ablation/top_heads                    the heads whose loss hurts name recall most (text)
    ablation/induction_loss/intact        the loss on the second copy of repeated random tokens
                                          (inspection/ablation.py), at the attention steps
    ablation/induction_loss/layer_{l}/head_{h}   the same with that head knocked out alone
    loss/in_context                       at each evaluation, on val: the loss late in the window
                                          minus early in it (training/evaluation.py); below 0:
                                          the model learns from its context
    HParams dashboard                     the run's hyperparameters and final metrics, when it
                                          ends: runs of a sweep side by side (hparams below)
    hparams/best_val_loss                 the metric that goes with them
"""

import time
from pathlib import Path

import torch
from torch.utils.tensorboard import SummaryWriter
from torch.utils.tensorboard.summary import hparams as hparams_summaries

from inspection.ablation import InductionAblation, RecallAblation
from inspection.heatmap import readable_token, render_attention_map, render_head_grid
from inspection.recall_probe import RecallScores
from inspection.tab_format import (
    INDUCTION_ABLATION,
    RECALL_HEADS,
    ablation_prefix,
    head_metric_prefix,
    head_scalar_tag,
    weights_summary,
)

# The scalars that bench/ and docs/ read back from a run, by the tags above.
BATCH_LOSS, TOKENS_PER_SEC = "train/batch_loss", "train/tokens_per_sec"
IN_CONTEXT_LOSS = "loss/in_context"
RECALL_ACCURACY = "recall/accuracy"
NAME_RECALL = f"{RECALL_ACCURACY}_name"


def loss_tag(split: str) -> str:
    """An evaluation's mean loss on a split: loss/train, loss/val."""
    return f"loss/{split}"


VAL_LOSS = loss_tag("val")


def attention_tag(layer: int, head: int) -> str:
    return f"attention/layer_{layer}/head_{head}"


def after_earlier_event_files(log_dir: Path) -> None:
    """Waits, when it must, so that the event file about to be made sorts after the folder's earlier
    ones. TensorBoard reads a run's event files in the order of their names, and while a run is
    live it follows it only into files that sort after the one it is reading. The names begin with
    the second each file was made, then the host and the process id
    (events.out.tfevents.<seconds>.<host>.<pid>.<n>): a run resumed, or restarted by torchrun,
    within the second its earlier file was made could sort before it (a lower process id), and
    TensorBoard would then show the earlier steps alone, or mix the two up. So wait for the next
    second (a clock set back by more than a second is not waited for)."""
    seconds = [int(field) for path in log_dir.glob("events.out.tfevents.*")
               if (field := path.name.split(".")[3]).isdigit()]
    later = max(seconds, default=0) + 1
    if later - time.time() > 2:
        return
    while (wait := later - time.time()) > 0:
        time.sleep(wait)


class RunLogger:
    """Writes one run's events to log_dir; with log_dir None (a rank other than 0 under
    torchrun: one process logs for all) every method does nothing."""

    def __init__(self, log_dir: Path | None, purge_step: int | None = None) -> None:
        # purge_step: TensorBoard hides events of this step and later from earlier files in
        # the folder, which a resumed run is about to write again.
        if log_dir:
            after_earlier_event_files(Path(log_dir))
        self.writer = SummaryWriter(log_dir=str(log_dir), purge_step=purge_step) if log_dir else None

    def scalars(self, step: int, values: dict[str, float]) -> None:
        if not self.writer:
            return
        for tag, value in values.items():
            self.writer.add_scalar(tag, value, step)

    def text(self, tag: str, text: str, step: int) -> None:
        # TensorBoard renders text as Markdown: indenting by 4 spaces makes it a code
        # block, which keeps line breaks and shows the text exactly as generated.
        if self.writer:
            self.writer.add_text(tag, "\n".join("    " + line for line in text.splitlines()), step)

    def attention_maps(self, step: int, weights: torch.Tensor, labels: list[str], window: int | None = None) -> None:
        """weights: (n_layer, n_head, T, T) for one probe sequence; labels: T token strings;
        window: the model's (the keys it hides are drawn grey, as the future is)."""
        if not self.writer:
            return
        weights_np = weights.float().cpu().numpy()
        for layer in range(weights_np.shape[0]):
            for head in range(weights_np.shape[1]):
                title = f"layer {layer} · head {head} · step {step}    rows: queries, columns: keys"
                image = render_attention_map(weights_np[layer, head], labels, title, window=window)
                self.writer.add_image(attention_tag(layer, head), image, step, dataformats="HWC")

    def attention_weights(self, step: int, weights: torch.Tensor, labels: list[str], window: int | None = None) -> None:
        """weights: (n_layer, n_head, T, T), for the Attention tab (inspection/tab_format.py)."""
        if self.writer:
            numbers = weights.detach().to(torch.float16).cpu().numpy()
            summary = weights_summary(numbers, [readable_token(s) for s in labels], window)
            self.writer.file_writer.add_summary(summary, step)

    def head_grid(self, step: int, weights: torch.Tensor, window: int | None = None) -> None:
        """weights: (n_layer, n_head, T, T): all heads in one image, to scrub through time."""
        if self.writer:
            image = render_head_grid(weights.float().cpu().numpy(), f"all heads · step {step}    rows: queries, columns: keys",
                                     window)
            self.writer.add_image("attention/all_heads", image, step, dataformats="HWC")

    def head_metrics(self, step: int, metrics: dict[str, torch.Tensor]) -> None:
        """metrics: {name: (n_layer, n_head)}, one scalar per head under head_{name}/."""
        for name, values in metrics.items():
            self.per_head(step, head_metric_prefix(name), values)

    def per_head(self, step: int, prefix: str, values: torch.Tensor) -> None:
        """values: (n_layer, n_head), one scalar per head: {prefix}/layer_{l}/head_{h}."""
        L, H = values.shape
        self.scalars(step, {head_scalar_tag(prefix, layer, head): values[layer, head].item()
                            for layer in range(L) for head in range(H)})

    def hparams(self, params: dict[str, int | float | str | bool], metrics: dict[str, float]) -> None:
        """The run's hyperparameters and final metrics, for TensorBoard's HParams tab. Written
        into this run's own event file (SummaryWriter.add_hparams would start a new sub-run)."""
        if not self.writer:
            return
        for summary in hparams_summaries(params, metrics):  # the experiment, the session's start and end
            self.writer.file_writer.add_summary(summary)
        self.scalars(0, metrics)

    def recall(self, step: int, scores: RecallScores) -> None:
        self.scalars(step, {RECALL_ACCURACY: scores.accuracy,
                            **{f"{RECALL_ACCURACY}_{kind}": value for kind, value in scores.accuracy_by_kind.items()}})
        self.per_head(step, RECALL_HEADS, scores.head_weight)
        top = three_heads(scores.head_weight, highest=True)
        self.text("recall/top_heads", f"weight on the earlier mention: {top}", step)

    def ablation(self, step: int, ablation: RecallAblation) -> None:
        self.per_head(step, ablation_prefix(ablation.kind), ablation.without)
        worst = three_heads(ablation.without, highest=False)
        self.text("ablation/top_heads", f"{ablation.kind} recall {ablation.intact:.2f} with every head; without {worst}", step)

    def induction_ablation(self, step: int, ablation: InductionAblation) -> None:
        self.scalars(step, {f"{INDUCTION_ABLATION}/intact": ablation.intact})
        self.per_head(step, INDUCTION_ABLATION, ablation.without)

    def probe_tokens(self, labels: list[str]) -> None:
        """The probe text, token by token, so a heatmap's axes can be read in full."""
        self.text("attention/probe", " | ".join(readable_token(label) for label in labels), 0)

    def flush(self) -> None:
        if self.writer:
            self.writer.flush()

    def close(self) -> None:
        if self.writer:
            self.writer.close()


def three_heads(values: torch.Tensor, highest: bool) -> str:
    """The three heads with the highest (or lowest) of values (n_layer, n_head), as text."""
    H = values.shape[1]
    flat = values.flatten()  # (L * H,)
    order = flat.argsort(descending=highest, stable=True)[:3].tolist()
    return ", ".join(f"layer {i // H} head {i % H}: {flat[i]:.2f}" for i in order)
