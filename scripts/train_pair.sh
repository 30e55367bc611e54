#!/usr/bin/env bash
# Train the embedded target/draft pair and the held-out prompt sets (about 40 minutes on 2 CPU cores).
# Writes speclab/checkpoints/{target,draft,draft-*}, MANIFEST.json, corpus_files.json and
# speclab/data/prompts.json; periodic checkpoints and the log go to runs/pair/ (git-ignored).
# Extra arguments go to `python -m speclab.train` (e.g. --target-steps N --draft-steps M to repeat
# the committed run exactly; MANIFEST.json's "reproduce" field has the numbers).
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-.venv/bin/python}"
mkdir -p runs/pair
"$PY" -m speclab.train --preset full --out speclab/checkpoints --work runs/pair \
    --prompts-out speclab/data/prompts.json --log-file runs/pair/train.log "$@"
