"""`serve.autoscale`: the SLO policy, the simulator's preview of a role change, and the thread that
applies it.
"""
