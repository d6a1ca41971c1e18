"""Models in and out: checkpoints, and Hugging Face's formats for weights and tokenizers."""
