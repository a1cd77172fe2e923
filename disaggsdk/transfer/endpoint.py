"""Opening one native fabric-lib endpoint (`fab_engine`) by provider name, and tearing it down.

Teardown has an order, which is why it lives in one function: waiters are woken and new work
refused (fab_shutdown) before the pump that drains the endpoint's events stops, and peers'
regions are unmapped only after fab_close, since until then the progress thread may still be
copying into them.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from disaggsdk.transfer.errors import TransferError
from disaggsdk.transfer.interfaces import tcp_domain

if TYPE_CHECKING:
    from disaggsdk.transfer.completions import CompletionPump
    from disaggsdk.transfer.direct_targets import DirectTargets

# Short names accepted for the providers that need a utility layer for RDM endpoints.
PROVIDER_ALIASES = {"tcp": "tcp;ofi_rxm", "verbs": "verbs;ofi_rxm"}
_ERROR_TEXT_BYTES = 512


def open_endpoint(ffi: Any, lib: Any, provider: str, domain: str | None, hmem: bool) -> Any:
    """Opens an RDM endpoint with RMA writes.

    Args:
        ffi, lib: the loaded native module (`load_native`).
        provider: a full libfabric provider name (`PROVIDER_ALIASES` applied).
        domain: NIC / domain name. None: for tcp the interface ``FI_TCP_IFACE`` names, else "lo",
            so regions are not reachable from the network unless a NIC is named
            (`interfaces.tcp_domain`); the provider's first domain otherwise.
        hmem: ask for device-memory (FI_HMEM) support.

    Returns:
        The native ``fab_engine *``.

    Raises:
        TransferError: the provider cannot open such an endpoint; the message has its reason.
    """
    if domain is None and provider.startswith("tcp"):
        domain = tcp_domain(None)
    out = ffi.new("fab_engine **")
    err = ffi.new("char[]", _ERROR_TEXT_BYTES)
    rc = lib.fab_open(provider.encode(), domain.encode() if domain else ffi.NULL, int(hmem), out, err,
                      _ERROR_TEXT_BYTES)
    if rc < 0:
        raise TransferError(f"cannot open a {provider!r} endpoint: {ffi.string(err).decode(errors='replace')}")
    return out[0]


def close_endpoint(lib: Any, engine: Any, pump: CompletionPump, direct_targets: DirectTargets) -> None:
    """Stops the progress thread and the pump, frees the native engine, unmaps peers' regions.

    Holds no reference to the `TransferEngine`, so it can be that engine's finalizer.
    """
    lib.fab_shutdown(engine)
    pump.stop()
    lib.fab_close(engine)
    direct_targets.close()
