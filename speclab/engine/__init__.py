"""The engine: request, scheduler, model runner and loop (see llm_engine.py)."""
