"""Pure objective library: every function takes arrays and returns arrays (and metric sums).

Imports nothing else from pgjax and does no I/O. Equation numbers refer to "From REINFORCE to
Dr. GRPO: a unified perspective on LLM post-training".
"""
from pgjax.core.advantages import (
    broadcast_over_tokens,
    greedy_baseline_advantages,
    group_advantages,
    group_mean,
    group_std,
    leave_one_out_mean,
    sequence_scores,
    whiten,
)
from pgjax.core.aggregation import AGGREGATIONS, Normalizer, aggregate, length_weights, loss_normalizer
from pgjax.core.algorithms import (
    CORRECTIONS,
    Algorithm,
    Batch,
    HParams,
    Spec,
    advantages,
    batch_metrics,
    check_hparams,
    combine_metrics,
    finalize_metrics,
    hparam_grid,
    loss,
    stack_hparams,
    token_weights,
    value_targets,
)
from pgjax.core.estimator import REQUIRABLE, Estimator, hparam_items
from pgjax.core.estimator_checks import check_estimator
from pgjax.core.logprobs import chunked_logprobs_and_entropy, entropy_from_logits, token_logprobs
from pgjax.core.objectives import (
    clipped_mask,
    clipped_objective,
    importance_ratio,
    kl_estimate,
    modified_ratio,
    on_policy_ratio,
    sequence_ratio,
    truncated_is_weight,
    value_loss,
)
from pgjax.core.off_policy import (
    IS_LEVELS,
    IS_MODES,
    MISMATCH_BAND,
    correction_weights,
    limit_weights,
    mismatch_metrics,
    raw_weights,
)
from pgjax.core.presets import PRESETS, preset
from pgjax.core.returns import as_token_rewards, discounted_returns, gae, lambda_returns, outcome_to_token_rewards
from pgjax.core.reward_models import (
    STEP_REWARDS,
    bradley_terry_loss,
    pairwise_wins,
    step_classification_loss,
    step_rewards,
)
