"""The router over a `Runtime`, the OpenAI-compatible front end over a `ServingBackend`, metrics.

Nothing is imported here: FastAPI, uvicorn and the engine load on use.
"""
