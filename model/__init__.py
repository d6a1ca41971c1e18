"""The network and only the network: attention, blocks, GPT. No file I/O, no config system."""

from model.attention import CausalSelfAttention
from model.gpt import GPT, GPTConfig, eval_mode

__all__ = ["GPT", "GPTConfig", "CausalSelfAttention", "eval_mode"]
