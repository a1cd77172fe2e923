"""`serve.routing`: how the router picks a decode unit; YAML, builder and refusals."""

import pytest

from disaggsdk.errors import SpecError
from disaggsdk.face.cluster import Cluster
from disaggsdk.spec import spec_from_dict, spec_to_dict


def test_routing_defaults_to_cache_aware_and_round_trips():
    assert spec_from_dict({}).serve.routing == "cache_aware"
    spec = spec_from_dict({"serve": {"routing": "least_loaded"}})
    assert spec.serve.routing == "least_loaded"
    assert spec_from_dict(spec_to_dict(spec)) == spec


def test_an_unknown_policy_is_refused_at_its_yaml_path():
    with pytest.raises(SpecError) as info:
        spec_from_dict({"serve": {"routing": "bogus"}})
    assert info.value.problems == ["$.serve.routing: 'bogus' is not valid; use one of cache_aware, least_loaded"]


def test_the_builder_sets_it_with_the_other_serve_keys():
    c = Cluster().serve(port=9000, routing="least_loaded")
    assert (c.draft.serve.port, c.draft.serve.routing) == (9000, "least_loaded")
    assert Cluster().serve(port=9001).draft.serve.routing == "cache_aware"
    with pytest.raises(ValueError, match="routing: 'round_robin' is not valid"):  # as any builder value
        Cluster().serve(routing="round_robin")


def test_the_builder_sets_the_otlp_traces_endpoint_and_refuses_what_is_not_http():
    c = Cluster().serve(port=9000, otlp_traces_endpoint="http://localhost:4318/v1/traces")
    assert c.draft.serve.otlp_traces_endpoint == "http://localhost:4318/v1/traces" and c.draft.serve.port == 9000
    assert Cluster().serve(port=9001).draft.serve.otlp_traces_endpoint is None
    with pytest.raises(ValueError, match=r"Cluster.serve\(otlp_traces_endpoint='grpc://x'\).*http:// or https://"):
        Cluster().serve(otlp_traces_endpoint="grpc://x")
