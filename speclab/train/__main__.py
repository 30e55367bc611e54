"""`python -m speclab.train [--preset full|tiny] [--out DIR]`: train and ship the embedded pair."""

import argparse
import sys

from speclab.train.pipeline import PRESETS, run


def main(argv=None):
    ap = argparse.ArgumentParser(prog="python -m speclab.train", description=__doc__)
    ap.add_argument("--preset", choices=sorted(PRESETS), default="full")
    ap.add_argument("--out", default=None, help="output directory (default: speclab/checkpoints)")
    ap.add_argument("--work", default=None, help="periodic checkpoints and log (default: OUT/_work)")
    ap.add_argument("--prompts-out", default=None, help="also write the held-out prompt sets here")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--target-steps", type=int, default=None, help="fixed steps instead of the time budget")
    ap.add_argument("--draft-steps", type=int, default=None, help="fixed steps instead of the time budget")
    ap.add_argument("--log-file", default=None, help="default: WORK/train.log")
    ap.add_argument("--reuse", nargs="*", default=(), choices=("target", "draft-distilled", "draft-data"),
                    help="load these models from WORK (trained by an earlier run) instead of training them")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--target-minutes", type=float, default=None, help="the target's time budget (default: preset)")
    ap.add_argument("--draft-minutes", type=float, default=None, help="each draft's time budget (default: preset)")
    ap.add_argument("--init-target", default=None, help="continue the target from this checkpoint directory")
    args = ap.parse_args(argv)
    return run(args.preset, args.out, args.prompts_out, args.work, args.log_file, seed=args.seed,
               target_steps=args.target_steps, draft_steps=args.draft_steps, reuse=tuple(args.reuse),
               threads=args.threads, target_minutes=args.target_minutes, draft_minutes=args.draft_minutes,
               init_target=args.init_target)


if __name__ == "__main__":
    main(sys.argv[1:])
