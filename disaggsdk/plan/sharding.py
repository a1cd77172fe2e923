"""KV sharding of one tensor-parallel group: which KV heads each tp rank holds.

GQA splits KV heads over the tp ranks while ``tp <= num_kv_heads``; beyond that each head lives on
``tp / num_kv_heads`` ranks, and the ranks form that many **replica sets** (set ``s`` = the ranks
with ``tp_rank % (tp / num_kv_heads) == s``), each holding one full copy of the KV. MLA's latent
cannot be split by head, so every rank holds an identical full copy.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

import attrs

from disaggsdk.errors import SpecError
from disaggsdk.models.arch import AttentionKind

REPLICATED: Final = "replicated"
# [start, stop) of global KV head indices, or the whole MLA latent on every rank.
HeadRange: TypeAlias = tuple[int, int] | Literal["replicated"]


@attrs.frozen
class Sharding:
    """How one tp group of an instance shards its KV cache.

    ``num_shards`` distinct pieces exist; each is held by ``num_replica_sets`` ranks. For GQA a
    shard is ``heads_per_rank`` consecutive KV heads; for MLA there is one shard (the latent).
    """

    attention: AttentionKind
    tp: int
    num_kv_heads: int  # GQA KV heads; 1 for MLA

    @property
    def is_replicated(self) -> bool:
        """True when every rank holds the whole KV (MLA)."""
        return self.attention == "mla"

    @property
    def num_shards(self) -> int:
        """Distinct pieces of the KV across the group."""
        if self.is_replicated:
            return 1
        return min(self.tp, self.num_kv_heads)

    @property
    def num_replica_sets(self) -> int:
        """Full copies of the KV across the group (1 unless heads are replicated)."""
        return self.tp // self.num_shards

    @property
    def heads_per_rank(self) -> int:
        """KV heads stored on one rank (GQA); 1 latent "head" for MLA."""
        if self.is_replicated:
            return 1
        return self.num_kv_heads // self.num_shards

    def shard_of(self, tp_rank: int) -> int:
        """The shard index tp rank ``tp_rank`` holds."""
        self._check_rank(tp_rank)
        return tp_rank // self.num_replica_sets

    def replica_set_of(self, tp_rank: int) -> int:
        """The replica set tp rank ``tp_rank`` belongs to (0 when there is one set)."""
        self._check_rank(tp_rank)
        return tp_rank % self.num_replica_sets

    def rank_of(self, shard: int, replica_set: int) -> int:
        """The tp rank holding ``shard`` in ``replica_set`` (inverse of shard_of/replica_set_of)."""
        assert 0 <= shard < self.num_shards and 0 <= replica_set < self.num_replica_sets
        return shard * self.num_replica_sets + replica_set

    def shard_heads(self, shard: int) -> tuple[int, int]:
        """[start, stop) of the global KV heads in ``shard`` (GQA only)."""
        assert not self.is_replicated, "MLA shards are not head ranges"
        return shard * self.heads_per_rank, (shard + 1) * self.heads_per_rank

    def kv_heads(self, tp_rank: int) -> HeadRange:
        """KV heads of tp rank ``tp_rank``: ``(start, stop)``, or ``"replicated"`` for MLA."""
        if self.is_replicated:
            self._check_rank(tp_rank)
            return REPLICATED
        return self.shard_heads(self.shard_of(tp_rank))

    def replica_set(self, tp_rank: int) -> int | None:
        """Replica set of a GQA rank when heads are replicated (tp > KV heads), else None."""
        if self.is_replicated or self.num_replica_sets == 1:
            return None
        return self.replica_set_of(tp_rank)

    def _check_rank(self, tp_rank: int) -> None:
        assert 0 <= tp_rank < self.tp, f"tp rank {tp_rank} outside tp={self.tp}"


def make_sharding(attention: AttentionKind, tp: int, num_kv_heads: int, path: str = "$.tp") -> Sharding:
    """Check a tp size against the model's KV heads and return the group's `Sharding`.

    Args:
        attention: "gqa" or "mla" (`ModelArch.attention`).
        tp: tensor-parallel size of the group.
        num_kv_heads: the model's KV heads (ignored for MLA).
        path: YAML path of the tp field, named in errors (e.g. "$.decode.tp").

    Returns:
        The group's sharding.

    Raises:
        SpecError: tp < 1, or (GQA) tp neither divides nor is a multiple of the KV heads.
    """
    if tp < 1:
        raise SpecError(f"{path}: tp must be at least 1, got {tp}")
    if attention == "mla":
        return Sharding("mla", tp, 1)
    if num_kv_heads < 1:
        raise SpecError(f"{path}: the model reports {num_kv_heads} KV heads; check its config.json")
    if num_kv_heads % tp and tp % num_kv_heads:
        fits = sorted({d for d in range(1, num_kv_heads + 1) if num_kv_heads % d == 0})
        raise SpecError(f"{path}: tp={tp} neither divides nor is a multiple of the model's {num_kv_heads} KV "
                        f"heads; use one of {fits} or a multiple of {num_kv_heads}")
    return Sharding("gqa", tp, num_kv_heads)
