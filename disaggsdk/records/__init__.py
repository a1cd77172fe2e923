"""Measured records: what a unit counts and ships, and what benchmarks and sweeps return.

Plain data that crosses a process or lands in a JSON document (`UnitCounters`, `RequestTransfer`,
`RequestSpanRecords`, `InstanceStats`, the CPU a figure was taken on, goodput sweeps), declared
once here, low in the layers, so that the engine and the messenger fill them and `report` (views and
accounting), `serve` and `bench` read them. Nothing here imports another disaggsdk package.
"""
