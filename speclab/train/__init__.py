"""Training the embedded target/draft pair: tokenizer, training loops, evaluation, the pipeline.

`python -m speclab.train` reproduces speclab/checkpoints; see pipeline.py for the stages. The real
model's draft: `python -m speclab.train.teacher` (the target's answers to training conversations),
then `python -m speclab.train.smollm2_draft` (smollm2_draft.py, smollm2_draft_eval.py).
"""

from speclab.train.evaluate import agreement, cost_ratio, decode_step_seconds, heldout_loss
from speclab.train.lm import ModelSpec, TrainSpec, loss_fn, num_params, train
from speclab.train.tokenizer import EOS, save_tokenizer, train_tokenizer

__all__ = ["EOS", "ModelSpec", "TrainSpec", "agreement", "cost_ratio", "decode_step_seconds",
           "heldout_loss", "loss_fn", "num_params", "save_tokenizer", "train", "train_tokenizer"]
