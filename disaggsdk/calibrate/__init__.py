"""Fitting hardware profiles to this machine and validating the simulator against real runs.

It times the real engine and real deployments, so it sits above the engine, launch, serve and
bench; `disaggsdk.sim` stays torch-free and only reads the profiles this package writes.
"""
