"""Registration of the ``"linkescape"`` torch.distributed backend.

``_autoload`` is the ``torch.backends`` entry point: torch runs it at the end
of ``import torch``, so ``dist.init_process_group("linkescape")`` works in any
script (torchrun children included) without importing linkescape. It must be
cheap and must never raise (torch turns an exception into a failed
``import torch``): it registers a creator and imports the process group's
modules (linkescape's core comes with this module's package). Set TORCH_DEVICE_BACKEND_AUTOLOAD=0
to turn autoloading off; ``import linkescape.torch`` registers as well.
"""

from __future__ import annotations

import logging

log = logging.getLogger("linkescape.torch")

BACKEND_NAME = "linkescape"
DEVICES = ["cpu", "cuda"]


def _create(opts, pg_options=None):
    """Creator for ``Backend.register_backend(..., extended_api=True)``."""
    from .process_group import ProcessGroupLinkEscape, make_config
    from .convert import seconds

    timeout_s = seconds(getattr(opts, "timeout", None))
    return ProcessGroupLinkEscape(
        attempt_store(opts.store), opts.group_rank, opts.group_size, opts.timeout,
        group_name=str(getattr(opts, "group_id", "") or ""),
        global_ranks=list(getattr(opts, "global_ranks_in_group", None) or []) or None,
        config=make_config(timeout_s, pg_options))


def attempt_store(store):
    """The store under a namespace of this torchrun attempt: torchrun's
    static rendezvous keeps one store across ``--max-restarts`` restarts, so
    the addresses the killed attempt published are still there; the workers
    of a restart must not read them."""
    import os

    attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT")
    if attempt is None or os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        return store
    import torch.distributed as dist

    run = os.environ.get("TORCHELASTIC_RUN_ID", "")
    return dist.PrefixStore(f"linkescape/{run}/attempt_{attempt}/", store)


def is_registered() -> bool:
    import torch.distributed as dist

    return BACKEND_NAME.upper() in getattr(dist.Backend, "_plugins", {})


def register() -> bool:
    """Register the backend with torch.distributed (idempotent). Returns
    whether it is registered."""
    import torch.distributed as dist

    if not dist.is_available():
        return False
    if is_registered():
        return True
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=DEVICES)
    return True


def _autoload() -> None:
    """Entry point run by ``import torch``; logs instead of raising. The process group's
    modules come now too (about 2 ms of CPU with their bytecode cached, beside torch's
    second): imported by the first ``init_process_group`` instead, they were a third of
    its CPU, and on a host with more ranks than cores that is what init waits for."""
    what = "register the torch.distributed backend"
    try:
        if register():
            what = "import the process group (the first init_process_group imports it)"
            from . import process_group  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - must never break `import torch`
        try:
            log.warning("linkescape: could not %s: %s", what, exc)
        except Exception:  # noqa: BLE001
            pass


__all__ = ["register", "is_registered", "BACKEND_NAME"]
