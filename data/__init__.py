"""Text in, token batches out, and back: corpora, tokenizers, the token cache and batching."""
