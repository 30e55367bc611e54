"""speclab serve: an OpenAI-compatible server with vLLM's metrics, and `speclab bench serve` (lesson 09).

    app.py           routes (FastAPI): completions, chat, models, health, metrics
    protocol.py      request/response shapes, validation into SamplingParams, the error shape
    async_engine.py  one engine loop (a thread) batching every client's requests, aborts, timings
    detokenize.py    incremental text with stop strings
    metrics.py       vLLM's Prometheus metrics under the `speclab:` prefix
    cli.py           the `speclab` command (serve, bench serve)
    bench_serve.py   the serving benchmark and its concurrency sweep

Nothing here is imported by the engine or by `speclab` itself: the server's libraries (FastAPI,
uvicorn) come with the `serve` extra.
"""
