"""Moving decoding requests between decode units, draining units, and changing how many units
prefill and how many decode (`rebalance`).
"""
