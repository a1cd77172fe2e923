"""Model architecture facts: the catalog, config.json reading, KV bytes per token."""

from disaggsdk.models.arch import ModelArch, arch_from_hf_config, dtype_bytes
from disaggsdk.models.catalog import TINY_VARIANT, catalog_config, catalog_names, is_tiny
from disaggsdk.models.resolve import read_hf_config, resolve_model

__all__ = ["ModelArch", "TINY_VARIANT", "arch_from_hf_config", "catalog_config", "catalog_names", "dtype_bytes",
           "is_tiny", "read_hf_config", "resolve_model"]
