"""Flax NNX causal LMs (Llama / Qwen2 / Qwen3) and Hugging Face import/export."""
