"""The HTTP surface: the OpenAI-compatible FastAPI app, its request and response bodies, the edge's
guards and limits, the control routes, and uvicorn in a thread.

Nothing is imported here: FastAPI and uvicorn load when a module of this package is imported.
"""
