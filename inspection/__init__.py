"""Looking inside the model: the attention heatmaps, what each head does in numbers, the recall
probe, the shape trace, the Attention tab's data format, and the tools that say what a head
writes and which heads cause an answer (the logit lens, direct logit attribution, activation
patching). The training loop logs the first; the Attention tab (attention_tab/) and notebooks
read them all."""
