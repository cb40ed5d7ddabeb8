"""The machine and the date a figure was measured on, printed with every figure reported."""

from __future__ import annotations

import contextlib
import datetime
import os
import platform


def cpu() -> str:
    """The CPU model, its logical CPUs and its last-level cache.

    For example ``"AMD EPYC 7B13, 2 logical CPUs, L3 32 MiB"``.

    Read from ``/proc/cpuinfo`` and ``/sys/devices/system/cpu`` on Linux; elsewhere what
    :mod:`platform` knows.
    """
    name = ""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as fh:
        name = next((ln.split(":", 1)[1].strip() for ln in fh if ln.startswith("model name")), "")
    name = name or platform.processor() or platform.machine() or "unknown CPU"
    text = f"{name}, {os.cpu_count()} logical CPUs"
    cache = _last_level_cache()
    return f"{text}, {cache}" if cache else text


def _last_level_cache() -> str:
    """``"L3 8 MiB"`` from sysfs (the highest cache level of CPU 0), or "" if unknown."""
    base = "/sys/devices/system/cpu/cpu0/cache"
    best = (0, "")
    try:
        for entry in os.listdir(base):
            if not entry.startswith("index"):
                continue
            with open(os.path.join(base, entry, "level")) as fh:
                level = int(fh.read())
            with open(os.path.join(base, entry, "size")) as fh:
                size = fh.read().strip()
            if level > best[0]:
                best = (level, size)
    except (OSError, ValueError):
        return ""
    if not best[0]:
        return ""
    size = best[1]
    if size.endswith("K") and size[:-1].isdigit() and int(size[:-1]) % 1024 == 0:
        size = f"{int(size[:-1]) // 1024} MiB"
    elif size.endswith("K"):
        size = f"{size[:-1]} KiB"
    return f"L{best[0]} {size}"


def stamp() -> str:
    """``"measured on 2026-12-01 (UTC) on <cpu()>"``: the line printed with every report."""
    today = datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    return f"measured on {today} (UTC) on {cpu()}"
