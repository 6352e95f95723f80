"""Settings for a process whose life is one long-running worker loop."""

from __future__ import annotations

import ctypes
import ctypes.util
import gc
import logging
import platform

__all__ = ["settle_process"]

log = logging.getLogger(__name__)

# glibc's mallopt() parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def settle_process(young_threshold: int = 100_000, heap_slack: int = 64 << 20) -> None:
    """Call once a worker process has started, before its loop.

    Garbage collector: start-up leaves hundreds of thousands of objects that live
    as long as the process (modules, parser tables, compiled graphs), and every
    collection of the oldest generation walks all of them; a busy worker allocates
    fast enough to trigger collections all the time. ``gc.freeze()`` moves what
    exists now out of the collector's sight, and a larger young generation means
    fewer collections (short-lived objects are freed by reference counting anyway;
    only cycles wait a little longer).

    Heap (glibc only): a worker allocates and frees replies of hundreds of KB per
    batch; by default glibc gives such memory back to the kernel at once and takes
    it again on the next batch (brk/mmap, then page faults), which was a quarter of
    the receipts worker's CPU. Up to ``heap_slack`` bytes of freed heap are kept.
    Measurements: docs/performance.md.
    """
    gc.collect()
    gc.freeze()
    _, middle, old = gc.get_threshold()
    gc.set_threshold(young_threshold, middle, old)
    if heap_slack > 0:
        _keep_heap(heap_slack)


def _keep_heap(slack: int) -> None:
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        for parameter, value in (
            (_M_MMAP_THRESHOLD, slack // 4),  # also stops glibc moving it by itself
            (_M_TRIM_THRESHOLD, slack),
            (_M_TOP_PAD, slack // 4),
        ):
            if libc.mallopt(parameter, value) != 1:
                log.debug("mallopt(%d, %d) refused", parameter, value)
    except (OSError, AttributeError) as error:  # no libc to load: defaults stay
        log.debug("heap settings not applied: %s", error)
