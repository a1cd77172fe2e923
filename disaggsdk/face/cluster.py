"""The fluent builder: ``Cluster().prefill(tp=8).decoders(3, tp=8).model("qwen3-coder")``.

Every call returns a new `Cluster` around a new frozen `Spec`, so re-running a notebook cell never
changes a value another cell holds. Single values are checked at each call; rules that need the
whole spec (tp against the model's heads) are checked by `.spec`, `.plan()` and `.launch()`.
"""

from __future__ import annotations

import html
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from disaggsdk.spec.rules import check_spec
from disaggsdk.spec.types import Spec
from disaggsdk.spec.yaml_io import load_spec, spec_to_yaml

if TYPE_CHECKING:
    from disaggsdk.face.deployment import Deployment
    from disaggsdk.plan import Plan


def _set(section: Any, **changes: Any) -> Any:
    return attrs.evolve(section, **{k: v for k, v in changes.items() if v is not None})


@attrs.frozen
class Cluster:
    """A deployment being described. `draft` is the spec so far, not yet cross-checked."""

    draft: Spec = attrs.field(factory=Spec)

    # roles
    def prefill(self, tp: int | None = None, dp: int | None = None, replicas: int | None = None) -> Cluster:
        """Shape of each prefill instance, and how many there are."""
        return Cluster(attrs.evolve(self.draft, prefill=_set(self.draft.prefill, tp=tp, dp=dp, replicas=replicas)))

    def decode(self, tp: int | None = None, dp: int | None = None, replicas: int | None = None) -> Cluster:
        """Shape of each decode instance, and how many there are."""
        return Cluster(attrs.evolve(self.draft, decode=_set(self.draft.decode, tp=tp, dp=dp, replicas=replicas)))

    def decoders(self, replicas: int, tp: int | None = None, dp: int | None = None) -> Cluster:
        """``replicas`` decode instances of ``tp`` x ``dp`` ranks each."""
        return self.decode(tp=tp, dp=dp, replicas=replicas)

    def prefills(self, replicas: int, tp: int | None = None, dp: int | None = None) -> Cluster:
        """``replicas`` prefill instances of ``tp`` x ``dp`` ranks each."""
        return self.prefill(tp=tp, dp=dp, replicas=replicas)

    # everything else
    def model(self, model: str) -> Cluster:
        """A catalog name (``qwen3-coder``, ``deepseek-r1``, ``*-tiny``) or a checkpoint directory."""
        return Cluster(attrs.evolve(self.draft, model=model))

    def named(self, name: str) -> Cluster:
        """Give the deployment a name (shown in plans and dashboards)."""
        return Cluster(attrs.evolve(self.draft, name=name))

    def device(self, device: str) -> Cluster:
        """``cpu`` or ``cuda``."""
        return Cluster(attrs.evolve(self.draft, device=device))

    def seed(self, seed: int) -> Cluster:
        """Seed of every random choice (replica-set assignment, tiny weights, sampling)."""
        return Cluster(attrs.evolve(self.draft, seed=seed))

    def hardware(self, gpu: str | None = None, gpus_per_node: int | None = None,
                 nics_per_node: int | None = None, nic_gbps: float | None = None) -> Cluster:
        """What one node offers."""
        hw = _set(self.draft.hardware, gpu=gpu, gpus_per_node=gpus_per_node,
                  nics_per_node=nics_per_node, nic_gbps=nic_gbps)
        return Cluster(attrs.evolve(self.draft, hardware=hw))

    def kv(self, layout: str | None = None, page_size: int | None = None, dtype: str | None = None) -> Cluster:
        """KV cache page layout (``HND``/``NHD``), tokens per page and dtype."""
        kv = _set(self.draft.kv, layout=layout, page_size=page_size, dtype=dtype)
        return Cluster(attrs.evolve(self.draft, kv=kv))

    def engine(self, num_pages: int | None = None, max_num_batched_tokens: int | None = None,
               max_num_seqs: int | None = None, prefix_caching: bool | None = None) -> Cluster:
        """Per-rank engine sizes, and the prefix cache (on by default, as vLLM's; see `EngineSettings`)."""
        engine = _set(self.draft.engine, num_pages=num_pages, max_num_batched_tokens=max_num_batched_tokens,
                      max_num_seqs=max_num_seqs, prefix_caching=prefix_caching)
        return Cluster(attrs.evolve(self.draft, engine=engine))

    def transport(self, provider: str, same_host_copy: bool | None = None) -> Cluster:
        """``auto``, ``shm``, ``tcp``, ``efa`` or ``verbs``; ``same_host_copy`` see `Transport`."""
        return Cluster(attrs.evolve(self.draft, transport=_set(self.draft.transport, provider=provider,
                                                               same_host_copy=same_host_copy)))

    def transfer(self, streaming: bool | None = None, deadline_s: float | None = None,
                 max_local_prefill_tokens: int | None = None) -> Cluster:
        """How the KV moves: layer streaming, the per-attempt deadline, and the prompts a decode
        instance prefills itself (at most ``max_local_prefill_tokens`` missing from its prefix cache;
        see `TransferSettings`)."""
        transfer = _set(self.draft.transfer, streaming=streaming, deadline_s=deadline_s,
                        max_local_prefill_tokens=max_local_prefill_tokens)
        return Cluster(attrs.evolve(self.draft, transfer=transfer))

    def speculative(self, method: str, num_tokens: int | None = None) -> Cluster:
        """Speculative decoding on the decode instances: ``"mtp"``, ``"ngram"`` or ``"none"``, with
        ``num_tokens`` drafts per step (1..4)."""
        spec = _set(self.draft.speculative, method=method, num_tokens=num_tokens)
        return Cluster(attrs.evolve(self.draft, speculative=spec))

    def serve(self, host: str | None = None, port: int | None = None, routing: str | None = None) -> Cluster:
        """Where the OpenAI-compatible endpoint listens, and how it picks a decode unit per request
        (``routing``: ``"cache_aware"`` or ``"least_loaded"``, see `Serve.routing`)."""
        serve = _set(self.draft.serve, host=host, port=port, routing=routing)
        return Cluster(attrs.evolve(self.draft, serve=serve))

    def on_ray(self, address: str | None = None) -> Cluster:
        """Run the units as Ray actors on a cluster's nodes (``address``: ``"auto"``, ``"HOST:PORT"``;
        None: a new one-node cluster), each instance in a placement group on the node the plan says."""
        return Cluster(attrs.evolve(self.draft, launch=_set(self.draft.launch, backend="ray", address=address)))

    # results
    @property
    def spec(self) -> Spec:
        """The finished spec, cross-checked against the model.

        Raises:
            SpecError: listing every problem.
        """
        return check_spec(self.draft)

    def to_yaml(self) -> str:
        """The spec as YAML, loadable by `Cluster.from_yaml` and ``disaggsdk launch``."""
        return spec_to_yaml(self.spec)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Cluster:
        """A builder starting from a spec file (validated)."""
        return cls(load_spec(path))

    def plan(self) -> Plan:
        """The sharding / placement / transfer plan (renders as a table, HTML in Jupyter)."""
        from disaggsdk.plan import make_plan

        return make_plan(self.spec)

    def launch(self, **options: Any) -> Deployment:
        """Start this deployment (on this machine, or on Ray after `on_ray`) behind an OpenAI-compatible server.

        Args:
            options: `disaggsdk.face.deployment.launch` options (``tiny``, ``colocated``,
                ``port`` -- 0 picks a free one --, ``api_key``...).
        Returns:
            a running `Deployment` (a context manager; ``shutdown()`` stops every process).
        Raises:
            SpecError, HardwareError: the spec cannot run here (the message says what instead).
        """
        from disaggsdk.face.deployment import launch

        return launch(self.spec, **options)

    def _repr_html_(self) -> str:
        return f"<pre>{html.escape(spec_to_yaml(self.draft))}</pre>"
