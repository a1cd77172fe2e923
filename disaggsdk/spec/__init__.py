"""Deployment specs: frozen attrs classes, YAML in/out, validation (data only; the fluent `Cluster` is in `disaggsdk.face`)."""

from disaggsdk.spec.convert import spec_from_dict, spec_to_dict
from disaggsdk.spec.engine_settings import EngineSettings, Speculative
from disaggsdk.spec.kv import KV, TransferSettings, Transport
from disaggsdk.spec.rules import check_spec, spec_problems
from disaggsdk.spec.serving import Launch, Serve
from disaggsdk.spec.topology import Hardware, Role
from disaggsdk.spec.types import Spec
from disaggsdk.spec.yaml_io import load_spec, parse_spec_yaml, save_spec, spec_to_yaml

__all__ = [
    "KV",
    "EngineSettings",
    "Hardware",
    "Launch",
    "Role",
    "Serve",
    "Spec",
    "Speculative",
    "TransferSettings",
    "Transport",
    "check_spec",
    "load_spec",
    "parse_spec_yaml",
    "save_spec",
    "spec_from_dict",
    "spec_problems",
    "spec_to_dict",
    "spec_to_yaml",
]
