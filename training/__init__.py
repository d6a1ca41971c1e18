"""The training loop and what it is made of, one role per module: the run built from its config,
the optimizer and LR schedule, the step, evaluation, the loop's periodic jobs, precision, ranks
under torchrun, resume state, TensorBoard logging and the progress bar."""
