"""The record of one RL step, as ``Trainer.step`` returns it and ``metrics.jsonl`` holds it: rollout
statistics, the finalized loss metrics, timings (``step_record``), and the names of its keys.

Rollout statistics (``STAT_KEYS``, one value per sampled row): the training reward, the verifier's
``correct``, the response length, whether it was truncated, whether it was kept for the update, and
whether a reward function gave a non-finite value; for multi-turn episodes also ``EPISODE_KEYS``.
What the step cost (``COST_KEYS``, which depend on the machine): the seconds of sampling (with
decoding and scoring), ``Learner.prepare``, the update and the whole step, generated tokens per second
of sampling, and ``peak_rss_gb``, the process's peak resident memory so far in GB
(``pgjax.machine.peak_resident_bytes``). ``padding``: the share of the token positions the update computes on
(the rollout's ``[B, P + N]`` after ``rollout.trim_padding``) that are padding, what packing
sequences could save at most. Mismatch metrics (``MISMATCH_KEYS``): the learner's vs the sampler's
log-probs of the sampled tokens (``core.off_policy``).
"""
from __future__ import annotations

from pgjax import core
from pgjax.machine import peak_resident_bytes

STAT_KEYS = ("reward", "correct", "length", "truncated", "kept", "nonfinite")
# with a learned reward (pgjax.train.learned_reward): its raw score, and its agreement with the verifier
LEARNED_STATS = ("learned", "agreement_pairs", "agreement_wins")
COST_KEYS = ("time_sample", "time_prepare", "time_update", "time_step", "tokens_per_second", "peak_rss_gb")
MISMATCH_KEYS = ("mismatch_abs", "mismatch_abs_max", "mismatch_kl", "mismatch_outside")
# multi-turn episodes only (``pgjax.rollout.episodes``): per episode, the mean replies, tool calls, the share
# of episodes that call a tool, the share of calls that ran, tokens after the prompt, and the observations cut;
# the episodes an environment error ended, and the first such error's message ("": none)
EPISODE_KEYS = ("turns", "calls", "call_rate", "valid_call_rate", "episode_tokens", "observation_cuts",
                "environment_errors", "environment_error")
RECORD_KEYS = ("step", "reward", "accuracy", "length", "length_correct", "length_incorrect", "truncated", "kept",
               "nonfinite_rewards", "skipped_updates", "policy_loss", "clip_fraction", "grad_norm", "entropy",
               "kl_ref", "kl_old", "value_loss", "policy_lag", *MISMATCH_KEYS, "is_weight", "is_limited",
               "eval_accuracy", "padding", "learned_reward", "reward_model_agreement", *COST_KEYS, *EPISODE_KEYS)


# what the presets' loss and the learner measure besides the recorded keys: not recorded; any other metric
# of an estimator's loss is (its own, under its name: a ``_sum`` as its token mean ``_mean``, a ``_min`` /
# ``_max`` as it is, anything else per applied optimizer step)
LOSS_METRICS = frozenset({"tokens", "sequences", "ratio_mean", "ratio_min", "ratio_max", "advantage_mean",
                          "approx_kl_mean", "ref_kl_mean", "entropy_mean", "kl_loss", "entropy_bonus", "policy_loss",
                          "clip_fraction", "grad_norm_max", "value_loss", "is_weight_mean", "is_limited_mean",
                          "mismatch_abs_mean", "mismatch_abs_max", "mismatch_kl_mean", "mismatch_outside_mean"})


def step_record(stats: dict, metrics: dict, times: dict) -> dict:
    """The record of one step: rollout statistics, finalized loss metrics (per applied optimizer step
    where they are sums; None when every update was skipped; an estimator's own metrics under their
    names, ``LOSS_METRICS``), timing."""
    correct = stats["correct"] == 1.0
    lengths = stats["length"].astype(float)
    fm = {k: float(v) for k, v in core.finalize_metrics(metrics).items()}
    steps = fm.pop("optimizer_steps")       # the applied ones: skipped updates add nothing to the sums
    out: dict[str, float | int | str | None] = {
        "reward": float(stats["reward"].mean()), "accuracy": float(correct.mean()),
        "length": float(lengths.mean()),
        "length_correct": float(lengths[correct].mean()) if correct.any() else None,
        "length_incorrect": float(lengths[~correct].mean()) if (~correct).any() else None,
        "truncated": float(stats["truncated"].mean()), "kept": float(stats["kept"].mean()),
        "nonfinite_rewards": int(stats["nonfinite"].sum()), "skipped_updates": int(fm.pop("skipped_updates")),
    }
    own = {key: value / max(steps, 1) if not key.endswith(("_mean", "_min", "_max")) else value
           for key, value in fm.items() if key not in LOSS_METRICS}
    losses = {"policy_loss": fm.pop("policy_loss") / max(steps, 1), "clip_fraction": fm.get("clip_fraction"),
              "grad_norm": fm["grad_norm_max"], "entropy": fm.get("entropy_mean"),
              "kl_ref": fm.get("ref_kl_mean"), "kl_old": fm["approx_kl_mean"]}
    if "value_loss" in fm:
        losses["value_loss"] = fm["value_loss"] / max(steps, 1)
    losses.update({key: fm.get(key if key.endswith("_max") else f"{key}_mean") for key in MISMATCH_KEYS})
    if "is_weight_mean" in fm:
        losses.update(is_weight=fm["is_weight_mean"], is_limited=fm["is_limited_mean"])
    out.update({k: v if steps else None for k, v in {**own, **losses}.items()})
    generated = float(lengths.sum())
    out.update(times, tokens_per_second=generated / max(times["time_sample"], 1e-9),
               peak_rss_gb=peak_resident_bytes() / 1e9)
    if "learned" in stats:
        pairs = float(stats["agreement_pairs"].sum())
        out.update(learned_reward=float(stats["learned"].mean()),
                   reward_model_agreement=float(stats["agreement_wins"].sum()) / pairs if pairs else None)
    if "turns" in stats:
        calls = stats["calls"].sum()
        out.update(turns=float(stats["turns"].mean()), calls=float(stats["calls"].mean()),
                   call_rate=float((stats["calls"] > 0).mean()),
                   valid_call_rate=float(stats["valid_calls"].sum() / calls) if calls else None,
                   episode_tokens=float((lengths + stats["observation_tokens"]).mean()),
                   observation_cuts=int(stats["cuts"].sum()),
                   environment_errors=int(stats["environment_errors"].sum()) if "environment_errors" in stats else 0,
                   environment_error=str(stats.get("environment_error", "")) or None)
    return out
