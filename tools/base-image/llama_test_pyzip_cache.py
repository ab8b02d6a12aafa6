"""Test image only (tools/base-image.sh): a cache of the code that CPython compiles for modules imported from zip
files, which Ansible's modules are (AnsiballZ payloads). zipimport never writes bytecode, so every task compiled
ansible.module_utils again from source: about a third of a module's CPU time in the test containers. The code
is the same as without the cache (compiled by the same interpreter from the same source, keyed by both); it
only skips the compilation. A .pth file imports this at interpreter start-up."""

import hashlib
import marshal
import os
import sys
import zipimport

CACHE = "/var/cache/llama-test-pyzip"
_compile = zipimport._compile_source  # pylint: disable=protected-access
_CODE = type(_compile.__code__)


def _located(code, filename):
    """The cached code, with the file name of this run's zip (tracebacks name the file that ran)."""
    consts = tuple(_located(const, filename) if isinstance(const, _CODE) else const for const in code.co_consts)
    return code.replace(co_filename=filename, co_consts=consts)


def _cached_compile(pathname, source):
    data = source if isinstance(source, bytes) else source.encode("utf-8", "surrogateescape")
    key = hashlib.sha256(b"%x\0%s\0" % (sys.hexversion, os.path.basename(pathname).encode()) + data).hexdigest()
    path = os.path.join(CACHE, key)
    try:
        with open(path, "rb") as cached:
            # One read, then loads: marshal.load on a file reads it piecemeal (51 cached files: 12.6 ms vs 3.1).
            return _located(marshal.loads(cached.read()), pathname)
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = _compile(pathname, source)
    try:
        os.makedirs(CACHE, mode=0o700, exist_ok=True)
        partial = f"{path}.{os.getpid()}"
        with open(partial, "wb") as out:
            marshal.dump(code, out)
        os.replace(partial, path)
    except OSError:
        pass
    return code


zipimport._compile_source = _cached_compile  # pylint: disable=protected-access
