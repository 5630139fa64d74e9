"""The one dtype rule of pgjax.core: compute in at least float32.

bfloat16 / float16 inputs are upcast to float32; float64 inputs (with
``jax_enable_x64``) stay float64, so exact audits can run in double precision.
"""
import jax
import jax.numpy as jnp


def at_least_f32(x) -> jax.Array:
    """``x`` as a float array of at least float32 precision."""
    x = jnp.asarray(x)
    return x.astype(jnp.promote_types(x.dtype, jnp.float32))
