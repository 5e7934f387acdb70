"""The OpenAI-compatible server: `build_app(engine, served_model_name)` (FastAPI), run by `tritonllm serve`."""
