"""The memory planner against a real run: SmolLM2-135M-Instruct, one GRPO step on one CPU device.

For each configuration (rows x (prompt + response) tokens, model options), two fresh processes, one at
a time, both with glibc's default malloc (``PGJAX_KEEP_FREED_MEMORY`` removed from the environment):

  plan:     ``pgjax.plan.Planner`` at that shape: per-device bytes from the compiled programs, for
            abstract arrays (nothing allocated);
  measure:  the real thing: ``hf.load``, a ``Learner`` (GRPO with its KL reference policy, K = 8,
            AdamW from ``OptimConfig()``), ``init_state`` (the loaded policy then dropped), a random
            rollout, and two steps of ``prepare`` + ``update``. Resident memory (``/proc/self/status``)
            is read right after the imports and JAX's start (the baseline: interpreter, libraries, JAX
            runtime); just before the second step, after ``malloc_trim(0)`` hands the memory malloc
            keeps free back to the kernel (so what stays is live: the state, compiled programs, Python
            objects); and at the second step's peak (``VmHWM``, reset through ``/proc/self/clear_refs``
            just before the step, so loading and compiling, done by then, are not in it). The
            whole process's peak is the larger of ``VmHWM`` before the reset and after the step.

Compared: the predicted total against the second step's peak minus the baseline (what the step needs
above the runtime), and the predicted transient (total minus the resident training state) against the
second step's peak minus the memory resident just before it. The CPU device's memory is the
process's, so RSS is what the device holds, plus whatever Python and JAX keep on the host besides.

    python benchmarks/plan_smollm2.py --model models/smollm2-135m-instruct \\
        --json benchmarks/results/plan_smollm2.json
"""
import argparse
import ctypes
import gc
import json
import os
import pathlib
import re
import subprocess
import sys
import time

from readme_tables import save_table

from pgjax import markdown

GROUP = 8
GIB = 2 ** 30
# (rows, prompt tokens, response tokens, model options)
CONFIGS = [(16, 64, 64, {}), (32, 64, 64, {"scan_layers": True, "remat": "save_nothing"})]


def status_kib(field: str) -> int:
    """A ``/proc/self/status`` field (VmRSS, VmHWM), KiB."""
    return int(re.search(rf"{field}:\s+(\d+) kB", pathlib.Path("/proc/self/status").read_text()).group(1))


def predict(model: str, rows: int, prompt_len: int, response_len: int, options: dict) -> dict:
    from pgjax import plan
    planner = plan.Planner(plan.load_model_config(model, **options), plan.parse_mesh("data=1"), prompt_len,
                           response_len, group_size=GROUP, name=pathlib.Path(model).name)
    return planner.plan(rows).as_dict()


def measure(model: str, rows: int, prompt_len: int, response_len: int, options: dict) -> dict:
    """The real step's memory, KiB of resident memory at each point the module docstring names."""
    import jax
    import numpy as np
    import transformers  # noqa: F401  (hf.load imports it; here, so that it is in the baseline)

    from pgjax import core
    from pgjax.config import OptimConfig, UpdateConfig
    from pgjax.models import hf
    from pgjax.rollout.batch import Rollout
    from pgjax.train.learner import Learner
    from pgjax.train.optim import make_optimizer

    jax.devices()
    baseline = status_kib("VmRSS")
    algorithm = core.preset("grpo")
    policy = hf.load(model, **options)
    learner = Learner(policy, algorithm, GROUP, UpdateConfig(), make_optimizer(OptimConfig()), None, True)
    state = learner.init_state(policy, jax.random.PRNGKey(0))
    vocab = policy.config.vocab_size
    del policy
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, response_len + 1, rows)
    rollout = Rollout(tokens=rng.integers(3, vocab, (rows, prompt_len + response_len)).astype(np.int32),
                      attention_mask=np.ones((rows, prompt_len + response_len), np.int32),
                      batch=core.Batch(mask=(np.arange(response_len) < lengths[:, None]).astype(np.float32),
                                       rewards=rng.integers(0, 2, rows).astype(np.float32), logp=None,
                                       group_size=GROUP))

    def step(state):
        start = time.perf_counter()
        state, metrics = learner.update(state, learner.prepare(state, rollout, algorithm.hparams), algorithm.hparams)
        jax.block_until_ready((state, metrics))
        return state, time.perf_counter() - start

    state, first_s = step(state)
    first_peak = status_kib("VmHWM")                             # loading, compiling and the first step
    gc.collect()
    retained = status_kib("VmRSS")
    ctypes.CDLL("libc.so.6").malloc_trim(0)                      # hand malloc's free memory back: live memory
    before = status_kib("VmRSS")
    pathlib.Path("/proc/self/clear_refs").write_text("5")        # reset VmHWM (and ru_maxrss) to the current RSS
    state, second_s = step(state)
    return {"baseline_kib": baseline, "retained_before_second_kib": retained, "before_second_kib": before,
            "second_peak_kib": status_kib("VmHWM"), "process_peak_kib": max(first_peak, status_kib("VmHWM")),
            "first_step_s": first_s, "second_step_s": second_s}


def child(kind: str, model: str, config: list) -> dict:
    """Run ``predict`` or ``measure`` in a fresh process (glibc's default malloc); its result."""
    env = {k: v for k, v in os.environ.items() if k != "PGJAX_KEEP_FREED_MEMORY"}
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--model", model, "--config", json.dumps(config)],
                         env=env, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def row(config, predicted: dict, measured: dict) -> list[str]:
    """One table row's cells, GiB; measured figures above the baseline."""
    rows, prompt_len, response_len, options = config
    options = ", ".join(f"{k}={v}" for k, v in options.items()) or "no scan, no remat"
    above = lambda key: (measured[key] - measured["baseline_kib"]) / 2 ** 20          # noqa: E731
    peak, live = above("second_peak_kib"), above("before_second_kib")
    total, state = predicted["total"] / GIB, predicted["state"] / GIB
    return [f"{rows} x ({prompt_len} + {response_len}), {options}", f"{state:.2f}", f"{live:.2f}", f"{total:.2f}",
            f"{peak:.2f}", f"{peak / total:.2f}", f"{total - state:.2f}", f"{peak - live:.2f}",
            f"{(peak - live) / (total - state):.2f}", f"{above('process_peak_kib'):.2f}"]


HEADER = ["rows x (prompt + response), options", "predicted state", "live before the step", "predicted total",
          "step peak", "measured / predicted", "predicted transient", "measured transient", "measured / predicted",
          "whole-process peak"]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--json")
    parser.add_argument("--child", choices=("predict", "measure"), help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps({"predict": predict, "measure": measure}[args.child](args.model, *json.loads(args.config))))
        return 0
    results, rows = [], []
    for config in CONFIGS:
        predicted, measured = child("predict", args.model, config), child("measure", args.model, config)
        results.append({"config": config, "predicted": predicted, "measured": measured})
        rows.append(row(config, predicted, measured))
        print(markdown.row(rows[-1]), flush=True)
    save_table(args.json, sys.argv[1:] if argv is None else argv, markdown.table(HEADER, rows).splitlines(),
               results=results)
    return 0


if __name__ == "__main__":
    sys.exit(main())
