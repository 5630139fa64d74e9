"""KV-cache sampling from a ``CausalLM``."""
from pgjax.sample.sampler import Decoding, Samples, SamplingConfig, generate, sampling_logprobs

__all__ = ["Decoding", "Samples", "SamplingConfig", "generate", "sampling_logprobs"]
