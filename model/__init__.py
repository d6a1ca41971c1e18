"""The network and only the network: attention, blocks, GPT, and generating text from it.
No file I/O, no config system."""

from model.attention import CausalSelfAttention
from model.generation import generate_text, generate_tokens
from model.gpt import GPT, GPTConfig, eval_mode
from model.hooks import ActivationCache, HookPoint

__all__ = ["GPT", "GPTConfig", "ActivationCache", "CausalSelfAttention", "HookPoint", "eval_mode", "generate_text", "generate_tokens"]
