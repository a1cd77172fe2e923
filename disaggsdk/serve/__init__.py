"""The OpenAI-compatible front end over a `ServingBackend`, its metrics, and `Deployment`.

Nothing is imported here: `disaggsdk.serve.deployment` (FastAPI, uvicorn, the engine) loads on use.
"""
