"""Device meshes, the logical-axis sharding rules and multi-process (``jax.distributed``) plumbing."""
