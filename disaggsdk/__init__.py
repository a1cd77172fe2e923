"""disaggsdk: serve LLMs with disaggregated prefill and decode.

Importing this package is light (attrs, cattrs, yaml, rich): a spec can be written, validated and
planned with no torch, no GPU and no native build. Engines, transport and launch load lazily.
"""

from disaggsdk.errors import DisaggError, ModelError, SpecError

__version__ = "0.1.0"

__all__ = ["Cluster", "DisaggError", "ModelError", "Spec", "SpecError", "load_spec", "__version__"]


def __getattr__(name: str):
    # Lazy so that `import disaggsdk` never pays for the spec converter before it is used.
    if name in ("Cluster",):
        from disaggsdk.face.cluster import Cluster

        return Cluster
    if name in ("Spec", "load_spec"):
        from disaggsdk import spec

        return getattr(spec, name)
    raise AttributeError(f"module 'disaggsdk' has no attribute {name!r}")
