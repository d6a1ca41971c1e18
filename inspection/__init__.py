"""Looking inside the model: the attention heatmaps, what each head does in numbers, the recall
probe, the shape trace, and the Attention tab's data format. The training loop logs them; the
Attention tab (attention_tab/) reads them."""
