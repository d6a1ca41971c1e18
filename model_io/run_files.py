"""The checkpoint files a run dir holds, by name, found without loading torch (the Attention tab
lists runs at TensorBoard's start): ckpt_last.pt, ckpt_best.pt, and the model-only checkpoints
train.keep_checkpoints kept along the way, checkpoints/step_000250.pt. What is inside a file is
model_io/checkpoint.py's business."""

from pathlib import Path

LAST, BEST = "ckpt_last.pt", "ckpt_best.pt"
KEPT = "checkpoints"  # the run dir's folder of model-only checkpoints, one per step of train.keep_checkpoints
LOG_SPACED = "log"  # train.keep_checkpoints=log: step 0, every power of two, and the last step


def kept_checkpoint_path(run_dir: Path, step: int) -> Path:
    """Where the model-only checkpoint kept at `step` lives: checkpoints/step_000250.pt."""
    return Path(run_dir) / KEPT / f"step_{step:06d}.pt"


def kept_checkpoints(run_dir: Path) -> dict[int, Path]:
    """The model-only checkpoints a run kept along the way (train.keep_checkpoints), by step, in
    step order; {} for a run that kept none."""
    found = {}
    for path in (Path(run_dir) / KEPT).glob("step_*.pt"):
        digits = path.stem.removeprefix("step_")
        if digits.isdigit() and path.is_file():
            found[int(digits)] = path
    return dict(sorted(found.items()))
