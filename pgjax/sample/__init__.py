"""KV-cache sampling from a ``CausalLM``."""
from pgjax.sample.sampler import Samples, SamplingConfig, generate, sampling_logprobs

__all__ = ["Samples", "SamplingConfig", "generate", "sampling_logprobs"]
