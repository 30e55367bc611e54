"""Benchmarks: ratios measured in one run, on one machine, never asserted in tests.

One place for every benchmark (`python -m speclab.bench WHICH`, see cli.py):
  cli.py      the command line; decode, spec (speclab vs transformers), roofline and ngram tables
  heads.py    every proposer side by side at batch 1, heads included (lesson 08)
  prompts.py  the held-out prompt sets and drafts the benchmarks share
  vs_vllm.py  speclab, real vLLM (from .venv-vllm) and transformers side by side (`vs-vllm`)
  serve.py    `speclab bench serve`: load a running server, report what `vllm bench serve` reports
  sweep.py    `speclab bench serve --sweep`: the concurrency sweep, with and without speculation
  serve_vs_vllm.py  `speclab serve` and real `vllm serve` under both serving clients and guidellm (`serve-vs-vllm`)
"""
