"""The command line: ``python -m pgjax.run experiments/<file>.py [--set key=value ...] [--resume]``.

Parses the arguments, loads and overrides the experiment, and hands it to
``pgjax.train.trainer.train`` (the training loop itself lives in ``pgjax.train``). A mistake in
the configuration (or a run directory in use, a changed experiment on resume, no intact checkpoint)
is printed as one or two plain lines and exits with status 2, before anything is written to disk; a
run stopped by a non-finite reward, repeated non-finite updates, a failing environment or running
out of memory exits with status 1, its last checkpoint intact; SIGTERM, SIGHUP or Ctrl-C finish the
current step, write its checkpoint and exit with 128 + the signal's number
(``pgjax.train.interrupts``); outside a run's steps (while the modules load, after the run) they end
the process at once, in one line.
"""
from __future__ import annotations

import signal
import sys

from pgjax.train import interrupts

if __name__ == "__main__":      # before the imports below, which take seconds
    interrupts.stop_at_once()

import argparse

from pgjax import config as config_lib
from pgjax.checks import ConfigError
from pgjax.errors import RunStopped
from pgjax.parallel import multihost
from pgjax.train.interrupts import DEFAULT_GRACE_PERIOD, RunInterrupted
from pgjax.train.memory import out_of_memory
from pgjax.train.sinks import read_records
from pgjax.train.trainer import train


def _epilog() -> str:
    lines = ["sections of an experiment (--set <section>.<field>=value; --print-config lists every key):"]
    lines += [f"  {name:<13} {summary}" for name, summary in config_lib.sections().items()]
    lines += ["  (the algorithm's traced hyperparameters, core.HParams: e.g. algorithm.hparams.kl_coef=0.01)",
              "", "exit status: 0 done, 1 stopped by a non-finite reward or update, a failing environment or "
              "running out of",
              "               memory (the last checkpoint is intact),",
              "             2 a configuration error, a run directory in use or holding another run, a changed input "
              "on resume,",
              "               or nothing intact to resume (nothing was written)",
              "             129 / 130 / 143 stopped by SIGHUP / Ctrl-C / SIGTERM after finishing the step and writing",
              "               its checkpoint (--resume continues; a second signal, or the grace period running out,",
              "               stops at once with the last complete checkpoint intact)"]
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m pgjax.run", description=__doc__.split("\n\n")[0],
                                     epilog=_epilog(), formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("experiment", help="an experiment file defining experiment() -> Experiment")
    parser.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                        help="override a config field by its dotted key (repeatable)")
    parser.add_argument("--resume", action="store_true",
                        help="continue the run from its newest intact checkpoint (the experiment must be unchanged "
                             "but for steps, evaluation, checkpoint and logging settings, mesh and micro-batches)")
    parser.add_argument("--resume-with-changes", action="store_true",
                        help="--resume with a changed experiment; the changes are recorded in changes.jsonl")
    parser.add_argument("--restart", action="store_true",
                        help="start the run again in the directory --resume would take, first moving its results "
                             "(final/, metrics, checkpoints) aside to <dir>-replaced-<date>; nothing is deleted")
    parser.add_argument("--grace-period", type=float, default=DEFAULT_GRACE_PERIOD, metavar="SECONDS",
                        help="after SIGTERM, SIGHUP or Ctrl-C, how long the current step and its checkpoint may "
                             f"take before the run stops at once (default {DEFAULT_GRACE_PERIOD:g}: schedulers send "
                             "SIGTERM a minute before SIGKILL; 0: signals stop the run at once)")
    parser.add_argument("--no-fallback", action="store_true",
                        help="with --resume, stop if the newest checkpoint is damaged instead of going back to the "
                             "newest intact one")
    parser.add_argument("--print-config", action="store_true",
                        help="print every key with the value this run would use, and exit")
    parser.add_argument("--no-progress", action="store_true", help="no progress bar or progress lines")
    return parser.parse_args(argv)


def main(argv=None) -> int:
    args = parse_args(argv)
    if not 0 <= args.grace_period <= config_lib.MAX_SECONDS:
        print(f"pgjax.run: error: --grace-period={args.grace_period} is invalid: seconds >= 0, at most "
              f"{config_lib.MAX_SECONDS:.0f}", file=sys.stderr)
        return 2
    try:
        exp = config_lib.override(config_lib.load(args.experiment), args.set)
        if args.print_config:
            print("\n".join(f"{key} = {value!r}" for key, value in config_lib.resolved(exp).items()))
            return 0
        directory = train(exp, resume=args.resume, progress=not args.no_progress,
                          accept_changes=args.resume_with_changes, fallback=not args.no_fallback,
                          restart=args.restart, grace_period=args.grace_period)
    except ConfigError as error:
        print(f"pgjax.run: error: {error}", file=sys.stderr)
        return 2
    except RunStopped as error:
        print(f"pgjax.run: stopped: {error}", file=sys.stderr)
        return 1
    except RunInterrupted as error:
        print(f"pgjax.run: {error}", file=sys.stderr)
        return 128 + error.signum
    except KeyboardInterrupt:       # before or after the run (during it, Ctrl-C is a RunInterrupted)
        print("pgjax.run: interrupted (Ctrl-C)", file=sys.stderr)
        return 128 + signal.SIGINT
    except Exception as error:      # out of host or device memory: one line; any other error as it is
        if (line := out_of_memory(error)) is None:
            raise
        print(f"pgjax.run: stopped: {line}", file=sys.stderr)
        return 1
    if multihost.is_primary():
        evals = [r for r in read_records(directory) if r.get("eval_accuracy") is not None]
        print(f"greedy eval accuracy: start {evals[0]['eval_accuracy']:.3f} -> end {evals[-1]['eval_accuracy']:.3f}"
              f"  ({directory})")
    return 0


if __name__ == "__main__":
    sys.exit(main())        # signals end the process at once here too (``stop_at_once``): no traceback
