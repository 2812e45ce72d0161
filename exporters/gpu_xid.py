"""XID errors: NVML's critical-XID events, counted per GPU and XID code by a background thread.

An XID is the driver's report of a GPU fault (13: graphics engine exception, 31: MMU fault, 48:
double-bit ECC, 79: fell off the bus, ...). NVML delivers them as events, not as a value to poll:
the thread registers each GPU for ``nvmlEventTypeXidCriticalError`` on one event set and waits
on it with a timeout (so ``stop`` is honoured within ``wait_ms``). A GPU that does not support the
event is left out (no series, one log line); see docs/gpu-collector.md.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from types import ModuleType
from typing import Any

log = logging.getLogger(__name__)

XID_CRITICAL_ERROR = 0x8  # nvmlEventTypeXidCriticalError
TIMEOUT = 10  # NVML_ERROR_TIMEOUT: nothing happened within the wait
_NOT_SUPPORTED = (3, 13)  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_FUNCTION_NOT_FOUND
#: after an unexpected wait error, pause this long so a broken driver does not spin a core
ERROR_BACKOFF_S = 1.0


class XidWatcher:
    """Counts XIDs through ``on_xid(gpu_index, xid)``; ``start`` registers, ``stop`` frees."""

    def __init__(self, nv: ModuleType, handles: list[Any], on_xid: Callable[[int, int], None], *,
                 wait_ms: int = 500) -> None:
        self.nv = nv
        self.handles = handles
        self.on_xid = on_xid
        self.wait_ms = wait_ms
        self.watched: list[int] = []  # GPU indexes registered for XID events
        self._set: Any = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> bool:
        """Register every GPU that supports XID events; False (and no thread) if none does."""
        nv = self.nv
        try:
            self._set = nv.nvmlEventSetCreate()
        except Exception as exc:  # NVMLError, or an NVML without events
            log.warning("XID events unavailable (event set): %s", exc)
            return False
        skipped: list[str] = []
        for i, h in enumerate(self.handles):
            try:
                supported = int(nv.nvmlDeviceGetSupportedEventTypes(h))
                if not supported & XID_CRITICAL_ERROR:
                    skipped.append(f"{i} (not supported)")
                    continue
                nv.nvmlDeviceRegisterEvents(h, XID_CRITICAL_ERROR, self._set)
                self.watched.append(i)
            except Exception as exc:
                code = getattr(exc, "value", None)
                skipped.append(f"{i} ({'not supported' if code in _NOT_SUPPORTED else exc})")
        if skipped:
            log.info("XID events: not watched on GPU %s", ", ".join(skipped))
        if not self.watched:
            self._free()
            return False
        self._thread = threading.Thread(target=self._loop, name="llmsla-gpu-xid", daemon=True)
        self._thread.start()
        return True

    def _index(self, device: Any) -> int | None:
        """The event's device as our GPU index (NVML's index of the handle it hands back)."""
        try:
            index = int(self.nv.nvmlDeviceGetIndex(device))
        except Exception as exc:
            log.warning("XID event from a device NVML cannot index: %s", exc)
            return None
        return index if 0 <= index < len(self.handles) else None

    def _loop(self) -> None:
        nv = self.nv
        while not self._stop.is_set():
            try:
                data = nv.nvmlEventSetWait(self._set, self.wait_ms)
            except Exception as exc:
                if getattr(exc, "value", None) == TIMEOUT:
                    continue
                log.warning("XID event wait failed: %s", exc)
                self._stop.wait(ERROR_BACKOFF_S)
                continue
            if not int(data.eventType) & XID_CRITICAL_ERROR:
                continue
            index = self._index(data.device)
            if index is not None:
                try:
                    self.on_xid(index, int(data.eventData))
                except Exception:  # a metrics bug must not end XID watching
                    log.exception("counting XID %s on GPU %d failed", data.eventData, index)

    def _free(self) -> None:
        if self._set is not None:
            try:
                self.nv.nvmlEventSetFree(self._set)
            except Exception as exc:
                log.debug("nvmlEventSetFree: %s", exc)
            self._set = None

    def stop(self, timeout_s: float | None = None) -> None:
        """Stop the thread (within one wait) and free the event set, before nvmlShutdown."""
        self._stop.set()
        if self._thread is not None:
            deadline = (self.wait_ms / 1000.0 + 1.0) if timeout_s is None else timeout_s
            started = time.monotonic()
            self._thread.join(deadline)
            if self._thread.is_alive():  # the driver did not return: leave the set alone
                log.warning("XID thread still waiting after %.1f s; not freeing its event set",
                            time.monotonic() - started)
                return
            self._thread = None
        self._free()
