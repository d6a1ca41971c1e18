"""Models in and out: the checkpoint format, and Hugging Face GPT-2 folders."""
