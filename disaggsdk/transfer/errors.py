"""Errors of the transfer layer."""

from __future__ import annotations

from disaggsdk.errors import DisaggError


class TransferError(DisaggError):
    """A transfer operation failed: a provider error (with libfabric's text) or a bad request."""


class NativeLibraryMissing(TransferError):
    """The native transfer library was not built or libfabric cannot be loaded."""
