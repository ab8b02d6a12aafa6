"""The names of llama.cpp's RPC tensor cache, and reading tensors into it (modules llama_rpc_index, llama_rpc_fill).

An RPC server started with -c keeps each weight tensor of more than 10 MiB (llama_gguf.HASH_THRESHOLD) as one file,
$LLAMA_CACHE/rpc/<hash>, the hash being the 64-bit FNV-1a of the tensor's bytes as stored in the GGUF, written as
16 lowercase hex digits (ggml-rpc.cpp, unchanged from protocol 3 to 7). The server trusts the file: whatever writes
the cache must write each entry whole, under its final name only once complete, with the hash recomputed over the
bytes written.

FNV-1a is a chain of one multiplication per byte: a Python loop does about 10 MB/s. The compiled one
(libllama-rpc-fnv.so, built with llama.cpp, role llamacpp's files/llama-rpc-fnv.c) runs at the speed of the core, and
ctypes releases the GIL while it runs, so threads hash several tensors at once.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import threading
import time

FNV_OFFSET = 0xCBF29CE484222325
FNV_PRIME = 0x100000001B3
CHUNK = 8 * 1024 * 1024
_MASK = (1 << 64) - 1


def entry_name(value):
    """The cache file name of a hash: 16 lowercase hex digits (%016 PRIx64)."""
    return f"{value:016x}"


def fnv1a_python(data, value=FNV_OFFSET):
    """FNV-1a in Python: the reference the compiled one is tested against (about 10 MB/s)."""
    for byte in bytes(data):
        value = ((value ^ byte) * FNV_PRIME) & _MASK
    return value


class Fnv1a:
    """FNV-1a through the compiled library at `library`; None or "" = the Python reference (tests, tiny data)."""

    def __init__(self, library=None):
        self.library = library or ""
        self._function = None
        if library:
            function = ctypes.CDLL(library).llama_rpc_fnv1a
            function.restype = ctypes.c_uint64
            function.argtypes = [ctypes.c_uint64, ctypes.c_void_p, ctypes.c_size_t]
            self._function = function

    def update(self, value, buffer, length):
        """The hash `value` continued over buffer[:length] (a bytearray)."""
        if self._function is None:
            return fnv1a_python(memoryview(buffer)[:length], value)
        if length == 0:
            return value
        address = ctypes.addressof(ctypes.c_char.from_buffer(buffer))
        return self._function(value, address, length)


class RateLimit:
    """A cap on the bytes per second that several threads read together; 0 = none."""

    def __init__(self, bytes_per_second):
        self.rate = float(bytes_per_second or 0)
        self.lock = threading.Lock()
        self.next_free = time.monotonic()

    def take(self, count):
        if self.rate <= 0:
            return
        with self.lock:
            now = time.monotonic()
            start = max(now, self.next_free)
            self.next_free = start + count / self.rate
        if start > now:
            time.sleep(start - now)


def hash_stream(read, size, fnv, sink=None, limit=None, progress=None):
    """(fnv1a, sha256 hex, bytes read) of `size` bytes taken from read(n) (a file's readinto-like callable that
    fills a buffer and returns the count), each chunk also written to `sink` (a file) when given.

    Stops early, with fewer bytes counted, when the source ends."""
    buffer = bytearray(min(CHUNK, max(size, 1)))
    value, sha256, done = FNV_OFFSET, hashlib.sha256(), 0
    while done < size:
        want = min(len(buffer), size - done)
        if limit is not None:
            limit.take(want)
        view = memoryview(buffer)[:want]
        got = read(view)
        if not got:
            break
        value = fnv.update(value, buffer, got)
        sha256.update(view[:got])
        if sink is not None:
            sink.write(view[:got])
        done += got
        if progress is not None:
            progress(got)
    return value, sha256.hexdigest(), done


def file_reader(handle, offset):
    """A read(view) over an open binary file from `offset` on (positional reads: threads may share the file)."""
    position = [offset]

    def read(view):
        count = os.preadv(handle.fileno(), [view], position[0])
        position[0] += count
        return count

    return read


def human_bytes(count):
    """1.5 GiB, 512 MiB, 12 KiB, 100 B."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{int(value)} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{count} B"


class Progress:
    """Thread-safe byte counter that appends a `progress: ...` line to `log` (read by the llama_job_wait action) at
    most every `every` seconds, and at the end."""

    def __init__(self, log, total, what, every=2.0):
        """Starts `log` afresh: what an earlier job wrote there is gone."""
        self.log, self.total, self.what, self.every = log, total, what, every
        if log:
            with open(log, "w", encoding="utf-8"):
                pass
        self.done = 0
        self.started = time.monotonic()
        self.shown = 0.0
        self.lock = threading.Lock()

    def line(self):
        elapsed = max(time.monotonic() - self.started, 1e-9)
        share = f" ({100 * self.done // self.total} %)" if self.total else ""
        return (f"progress: {self.what} {human_bytes(self.done)} of {human_bytes(self.total)}{share}, "
                f"{self.done / elapsed / 1e6:.0f} MB/s")

    def add(self, count):
        with self.lock:
            self.done += count
            now = time.monotonic()
            if self.log and now - self.shown >= self.every:
                self.shown = now
                self._write(self.line())

    def finish(self):
        if self.log:
            with self.lock:
                self._write(self.line())

    def _write(self, text):
        with open(self.log, "a", encoding="utf-8") as handle:
            handle.write(text + "\n")
