"""One KV page as a tier stores it: a header that says what the bytes mean, then the page's bytes.

The header carries a magic, the format version, the page's identity (model, layout, dtype, page
size, tp rank and size, page bytes), its block hash, the data length and a blake2b-128 digest of
the data. `decode_entry` gives the data back only when every one of them matches what the reader
expects: a page written by another model, rank or dtype, or torn or flipped on disk or in a store,
is refused (`CorruptPageError`), never loaded into the KV pool.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass

from disaggsdk.errors import DisaggError
from disaggsdk.kv.tiers.base import TierConfigError

MAGIC = b"DKVP"
FORMAT_VERSION = 1
DIGEST_BYTES = 16  # blake2b-128 of the page data
HEADER_ALIGN_BYTES = 64  # the data starts at a multiple of this, so a reader can view it as an aligned array
LAYOUTS = ("HND", "NHD", "MLA")
MAX_TEXT_BYTES = 4096  # model, layout and dtype each, UTF-8
MAX_HASH_BYTES = 255

# magic, version, header_bytes, page_size, tp_rank, tp_size, page_bytes, data_bytes, digest,
# block hash length, model length, layout length, dtype length; then the block hash, the three
# texts (UTF-8) and zeros up to header_bytes
_FIXED = struct.Struct(f"<4sHIIIIQQ{DIGEST_BYTES}sBHHH")
MIN_HEADER_BYTES = _FIXED.size  # what `entry_size` reads


class CorruptPageError(DisaggError):
    """An entry failed a check of `decode_entry`.

    Attributes:
        kind: what mismatched: "magic", "version", "length", "identity", "block_hash" or "digest".
    """

    def __init__(self, kind: str, detail: str):
        self.kind = kind
        super().__init__(f"corrupt KV page entry ({kind}): {detail}")


@dataclass(frozen=True)
class PageIdentity:
    """What a page's bytes mean; an entry written under another identity is never loaded.

    Raises:
        TierConfigError: a field out of range (the message names it).
    """

    model: str  # model name and checkpoint identity, as the engine passes them
    layout: str  # "HND" | "NHD" | "MLA"
    dtype: str  # KV dtype name: "float32", "bfloat16", "fp8"...
    page_size: int  # tokens per page
    tp_rank: int
    tp_size: int
    page_bytes: int  # bytes of one page over all layers of this rank

    def __post_init__(self) -> None:
        for name in ("model", "dtype"):
            value = getattr(self, name)
            if not value or len(value.encode()) > MAX_TEXT_BYTES:
                raise TierConfigError(f"PageIdentity.{name} must be 1 to {MAX_TEXT_BYTES} bytes of UTF-8, got {value!r}")
        if self.layout not in LAYOUTS:
            raise TierConfigError(f"PageIdentity.layout must be one of {', '.join(LAYOUTS)}, got {self.layout!r}")
        if not 1 <= self.page_size < 2**32:
            raise TierConfigError(f"PageIdentity.page_size must be >= 1 token, got {self.page_size}")
        if not 1 <= self.tp_size < 2**32 or not 0 <= self.tp_rank < self.tp_size:
            raise TierConfigError(f"PageIdentity needs 0 <= tp_rank < tp_size, got tp_rank {self.tp_rank}, "
                                  f"tp_size {self.tp_size}")
        if not 1 <= self.page_bytes < 2**63:
            raise TierConfigError(f"PageIdentity.page_bytes must be >= 1, got {self.page_bytes}")

    def digest(self) -> str:
        """16 hex digits of a blake2b over every field and the entry format version."""
        fields = [self.model, self.layout, self.dtype, self.page_size, self.tp_rank, self.tp_size,
                  self.page_bytes, FORMAT_VERSION]
        return hashlib.blake2b(json.dumps(fields).encode(), digest_size=8).hexdigest()

    def key(self, block_hash: bytes) -> str:
        """The tier key of the page with ``block_hash``: its hex, "-", and `digest`, so pages of other
        models, ranks, dtypes or layouts never share a key."""
        return f"{block_hash.hex()}-{self.digest()}"


def _texts(identity: PageIdentity) -> tuple[bytes, bytes, bytes]:
    return identity.model.encode(), identity.layout.encode(), identity.dtype.encode()


def _header_bytes(num_variable_bytes: int) -> int:
    unpadded = _FIXED.size + num_variable_bytes
    return -(-unpadded // HEADER_ALIGN_BYTES) * HEADER_ALIGN_BYTES


def encode_entry(identity: PageIdentity, block_hash: bytes, data: bytes | memoryview) -> bytes:
    """The entry of one page: header, then ``data``.

    Args:
        identity: what the page's bytes mean.
        block_hash: the page's chained hash (`kv.block_hash.page_hashes`), 1 to 255 bytes.
        data: the page, ``identity.page_bytes`` long.
    Raises:
        TierConfigError: ``data`` is not ``identity.page_bytes`` long, or ``block_hash`` is empty or too long.
    """
    view = memoryview(data).cast("B")
    if view.nbytes != identity.page_bytes:
        raise TierConfigError(f"a page of {view.nbytes} bytes under an identity of page_bytes {identity.page_bytes}: "
                              "give PageIdentity the bytes of one page over all layers of this rank")
    if not 1 <= len(block_hash) <= MAX_HASH_BYTES:
        raise TierConfigError(f"block_hash must be 1 to {MAX_HASH_BYTES} bytes, got {len(block_hash)}")
    model, layout, dtype = _texts(identity)
    variable = block_hash + model + layout + dtype
    header_bytes = _header_bytes(len(variable))
    digest = hashlib.blake2b(view, digest_size=DIGEST_BYTES).digest()
    fixed = _FIXED.pack(MAGIC, FORMAT_VERSION, header_bytes, identity.page_size, identity.tp_rank, identity.tp_size,
                        identity.page_bytes, view.nbytes, digest, len(block_hash), len(model), len(layout), len(dtype))
    padding = bytes(header_bytes - len(fixed) - len(variable))
    return b"".join((fixed, variable, padding, view))


def entry_size(raw: bytes | memoryview) -> int:
    """The bytes of the entry that ``raw`` starts with, as its header says (a reader that padded it,
    as the disk tier does, cuts it there).

    Raises:
        CorruptPageError: ``raw`` is shorter than a header or does not start with the magic.
    """
    view = memoryview(raw).cast("B")
    if view.nbytes < _FIXED.size:
        raise CorruptPageError("length", f"{view.nbytes} bytes, shorter than the {_FIXED.size}-byte header")
    magic, _, header_bytes, _, _, _, _, data_bytes, *_ = _FIXED.unpack_from(view)
    if magic != MAGIC:
        raise CorruptPageError("magic", f"starts with {bytes(magic)!r}, not {MAGIC!r}")
    return int(header_bytes) + int(data_bytes)


def decode_entry(identity: PageIdentity, block_hash: bytes, raw: bytes | memoryview) -> memoryview:
    """The page data of an entry, checked against what the reader expects.

    Args:
        identity: the identity the reader's pages have.
        block_hash: the hash of the page the reader asked for.
        raw: an entry from `encode_entry`, exactly (no padding).
    Returns:
        a view of ``raw``'s data, ``identity.page_bytes`` long.
    Raises:
        CorruptPageError: naming the first check that failed: magic, format version, length,
            an identity field, the block hash, the digest of the data.
    """
    view = memoryview(raw).cast("B")
    total = entry_size(view)
    (_, version, header_bytes, page_size, tp_rank, tp_size, page_bytes, data_bytes, digest,
     hash_len, model_len, layout_len, dtype_len) = _FIXED.unpack_from(view)
    if version != FORMAT_VERSION:
        raise CorruptPageError("version", f"format version {version}, this reader reads {FORMAT_VERSION}")
    variable_end = _FIXED.size + hash_len + model_len + layout_len + dtype_len
    if header_bytes < variable_end or total != view.nbytes:
        raise CorruptPageError("length", f"{view.nbytes} bytes, the header says {header_bytes} of header "
                                         f"(at least {variable_end}) and {data_bytes} of data")
    offset = _FIXED.size
    stored_hash = bytes(view[offset : offset + hash_len])
    offset += hash_len
    texts = []
    for length in (model_len, layout_len, dtype_len):
        try:
            texts.append(bytes(view[offset : offset + length]).decode())
        except UnicodeDecodeError:
            raise CorruptPageError("identity", "a text field of the header is not UTF-8") from None
        offset += length
    stored = {"model": texts[0], "layout": texts[1], "dtype": texts[2], "page_size": page_size,
              "tp_rank": tp_rank, "tp_size": tp_size, "page_bytes": page_bytes}
    for name, value in stored.items():
        expected = getattr(identity, name)
        if value != expected:
            raise CorruptPageError("identity", f"{name} is {value!r}, the reader's is {expected!r}")
    if stored_hash != block_hash:
        raise CorruptPageError("block_hash", f"entry of page {stored_hash.hex()}, asked for {block_hash.hex()}")
    if data_bytes != identity.page_bytes:
        raise CorruptPageError("length", f"{data_bytes} bytes of data, a page is {identity.page_bytes}")
    data = view[header_bytes:]
    if hashlib.blake2b(data, digest_size=DIGEST_BYTES).digest() != digest:
        raise CorruptPageError("digest", "the data's blake2b-128 differs from the header's")
    return data
