"""The face layer: what a user imports and types — `Cluster`, `Deployment`.

It may use every layer below (spec, plan, launch, serve, bench, report). Nothing is imported
here: `disaggsdk.face.deployment` (FastAPI, uvicorn, the engine) loads on use.
"""
