"""The planner: pure functions from a spec to instances, placement, KV sharding and routes.

No torch, no native code: a plan can be made and shown in a notebook with no GPU.
"""

from disaggsdk.plan.pages import PageRuns, PageShape
from disaggsdk.plan.placement import Instance, Rank
from disaggsdk.plan.plan import SCHEMA_VERSION, Plan, make_plan
from disaggsdk.plan.routes import Route, Transfer, mla_dp_source, request_offset
from disaggsdk.plan.sharding import REPLICATED, Sharding, make_sharding
from disaggsdk.plan.writes import ExpectedWrites, RankWrites, expected_writes, num_prefill_pages

__all__ = ["REPLICATED", "SCHEMA_VERSION", "ExpectedWrites", "Instance", "PageRuns", "PageShape", "Plan", "Rank",
           "RankWrites", "Route", "Sharding", "Transfer", "expected_writes", "make_plan", "make_sharding",
           "mla_dp_source", "num_prefill_pages", "request_offset"]
