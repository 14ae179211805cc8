"""Where a collector server's memory goes, sampled every 0.25 s: put this folder on PYTHONPATH of a bench that starts
`tracejudge serve` (Python imports `sitecustomize` at start), e.g.

    PYTHONPATH=bench/allocator_sampler python bench/pipeline_pace.py [--rates 1000000]
    PYTHONPATH=bench/allocator_sampler ALLOCATOR_DECAY_MS=0 ALLOCATOR_DECAY=dirty python bench/pipeline_pace.py

Each `serve` process appends JSON lines to ALLOCATOR_SAMPLES (default /tmp/allocator_samples.jsonl): its RSS split
into mapped files, glibc's main heap and its other arenas and the other anonymous memory, and DuckDB's jemalloc
(`stats.resident`, `allocated`, `active`, `metadata`, dirty and muzzy pages) through the `duckdb_je_mallctl` the
collector purges with. ALLOCATOR_DECAY_MS sets jemalloc's decay for the kinds in ALLOCATOR_DECAY (dirty,muzzy) at
start. Other processes (the bench, the workers) are left alone.
"""

from __future__ import annotations

import ctypes
import json
import os
import sys
import threading
import time

_HEAP_ALIGN = 64 << 20  # glibc's non-main arenas are heaps mapped at multiples of this


def _split() -> dict[str, int]:
    """RSS in MB by kind of mapping."""
    kinds = {"file": 0, "main_heap": 0, "arenas": 0, "other_anon": 0}
    kind = "other_anon"
    with open("/proc/self/smaps") as smaps:
        for line in smaps:
            parts = line.split()
            if "-" in parts[0] and len(parts) >= 5 and ":" in parts[3]:
                start = int(parts[0].split("-")[0], 16)
                path = parts[5] if len(parts) > 5 else ""
                kind = ("file" if path.startswith("/") else "main_heap" if path == "[heap]"
                        else "arenas" if not path and start % _HEAP_ALIGN == 0 and "rw" in parts[1] else "other_anon")
            elif parts[0] == "Rss:":
                kinds[kind] += int(parts[1])
    return {name: kb >> 10 for name, kb in kinds.items()}


def _jemalloc(mallctl: object) -> dict[str, int]:
    epoch = ctypes.c_uint64(1)
    mallctl(b"epoch", None, None, ctypes.byref(epoch), 8)  # type: ignore[operator]
    out = {}
    for name in ("resident", "allocated", "active", "metadata", "arenas.4096.pdirty", "arenas.4096.pmuzzy"):
        value, size = ctypes.c_size_t(0), ctypes.c_size_t(8)
        if mallctl(f"stats.{name}".encode(), ctypes.byref(value), ctypes.byref(size), None, 0) == 0:  # type: ignore[operator]
            pages = name.startswith("arenas.")
            out["je_" + name.rsplit(".", 1)[-1]] = (value.value * (4096 if pages else 1)) >> 20
    return out


def _set_decay(mallctl: object) -> list[int]:
    """jemalloc's decay for new arenas and each existing one (an arena not yet initialised refuses: EFAULT)."""
    value = ctypes.c_ssize_t(int(os.environ["ALLOCATOR_DECAY_MS"]))
    kinds = os.environ.get("ALLOCATOR_DECAY", "dirty,muzzy").split(",")
    count, size = ctypes.c_uint(0), ctypes.c_size_t(4)
    mallctl(b"arenas.narenas", ctypes.byref(count), ctypes.byref(size), None, 0)  # type: ignore[operator]
    names = [f"arenas.{k}_decay_ms" for k in kinds] + [f"arena.{i}.{k}_decay_ms" for i in range(count.value)
                                                       for k in kinds]
    return [mallctl(n.encode(), None, None, ctypes.byref(value), 8) for n in names]  # type: ignore[operator]


def _sample() -> None:
    from tracejudge.collector.store.connection.memory_release import _duckdb_mallctl

    mallctl = _duckdb_mallctl()
    started = time.time()
    with open(os.environ.get("ALLOCATOR_SAMPLES", "/tmp/allocator_samples.jsonl"), "a") as out:
        if mallctl is not None and "ALLOCATOR_DECAY_MS" in os.environ:
            out.write(json.dumps({"pid": os.getpid(), "decay_set": _set_decay(mallctl)}) + "\n")
        while True:
            time.sleep(0.25)
            record: dict[str, object] = {"pid": os.getpid(), "t": round(time.time() - started, 2), **_split()}
            record["rss"] = sum(v for k, v in record.items() if k in ("file", "main_heap", "arenas", "other_anon"))
            if mallctl is not None:
                record.update(_jemalloc(mallctl))
            out.write(json.dumps(record) + "\n")
            out.flush()


if len(sys.argv) > 1 and "serve" in sys.argv[1:]:
    threading.Thread(target=_sample, daemon=True, name="allocator-sampler").start()
