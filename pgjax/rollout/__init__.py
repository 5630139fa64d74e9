"""Rollouts: prompts formatted and encoded, responses sampled and scored (``collect``), multi-turn episodes
with an environment (``episodes``), and the batch they hand the learner (``batch.Rollout``)."""
