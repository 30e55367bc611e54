"""speclab serve: an OpenAI-compatible server with vLLM's metrics, and `speclab bench serve` (lesson 09).

    app.py           routes (FastAPI): completions, chat, models, health, metrics; one error shape
    middleware.py    the body-size limit (413) and the API key guard (ASGI)
    protocol.py      request/response shapes, validation into SamplingParams, fields refused with a 400
    async_engine.py  one engine loop (a thread) batching every client's requests, aborts, timings,
                     and the one owner of what a request produced and why it ended
    detokenize.py    incremental text with stop strings (tokens past a stop are dropped)
    metrics.py       vLLM's Prometheus metrics under the `speclab:` prefix
    cli.py           the `speclab` command (serve, bench serve)

The serving benchmark (`speclab bench serve`, as `vllm bench serve`) and its concurrency sweep live
with the other benchmarks, in speclab/bench/serve.py and sweep.py (bench_serve.py and sweep.py here
are shims for the old import paths).

Nothing here is imported by the engine or by `speclab` itself: the server's libraries (FastAPI,
uvicorn) come with the `serve` extra.
"""
