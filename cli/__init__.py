"""The command-line layer train.py and sample.py share: the config schema, its checks, the errors, the run dir."""
