"""The pieces train.py and sample.py wire together, one role per module:
config checks and builders, the optimizer and LR schedule, checkpoints, TensorBoard
logging and attention heatmaps, the progress bar, and one-line error reporting."""
