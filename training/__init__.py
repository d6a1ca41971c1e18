"""The pieces train.py and sample.py wire together, one role per module:
config checks and builders, the optimizer and LR schedule, the step and the loop's periodic
jobs, checkpoints, TensorBoard logging, the progress bar, and one-line error reporting."""
