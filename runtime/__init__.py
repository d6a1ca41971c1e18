"""Where the code runs, for everything that runs a model: the machine and its device
(devices.py), the precision (precision.py), and the processes torchrun starts (ranks.py).
Training, sampling, exporting, the Attention tab and the command line share it; it imports
nothing of theirs."""
