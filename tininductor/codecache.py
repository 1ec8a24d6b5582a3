"""The code cache: generated source -> content hash -> files on disk -> a loaded module or library.

Compiling is slow (g++ takes ~0.5 s per kernel), so every generated kernel is stored under the
hash of everything that determines the result: the source text and, for C++, the compiler
and the CPU it targets. A second call, a second run or a second process finds the file and
skips the work.

Rules that keep it safe:

* one directory per user, mode 0700 (``$TINY_CACHE_DIR`` overrides the default
  ``~/.cache/tininductor``, or ``/tmp/tininductor_<user>`` when home is not writable). A
  directory with a loose mode is repaired; one owned by someone else is refused;
* every file is written to a temporary name and then ``os.replace``-d into place, so no
  reader ever sees half a file;
* a stored entry is verified against its key before it is used: a ``.py`` must equal the
  source we hold; a ``.so`` must match the SHA-256 recorded after it was built and carry the
  key it was built for (a string compiled into it). A corrupt, truncated or swapped entry is
  rebuilt, never loaded;
* a file lock around "check, build, load" makes processes compiling the same kernel at the
  same time take turns: the first builds, the others find its result.

``PyCodeCache.stats`` / ``CppCodeCache.stats`` count ``memory_hit``, ``disk_hit``, ``miss``
(built or written) and ``corrupt`` (found broken, rebuilt) so tests can see what happened.
"""
from __future__ import annotations

import collections
import ctypes
import getpass
import hashlib
import linecache
import os
import stat
import sys
import tempfile
import types
import warnings
from pathlib import Path

from filelock import FileLock

from tininductor import cpp_builder
from tinydynamo.utils import timed


class CacheDirError(PermissionError):
    """The cache directory cannot be trusted (wrong owner, or not a directory)."""


def _default_cache_dir() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if os.access(base, os.W_OK) or (not os.path.exists(base) and os.access(os.path.dirname(base), os.W_OK)):
        return Path(base) / "tininductor"
    return Path(tempfile.gettempdir()) / f"tininductor_{getpass.getuser()}"


def _secure_dir(path: Path, explicit: bool) -> Path:
    """Create ``path`` with mode 0700, or check (and repair) an existing one."""
    if not path.exists() and not path.is_symlink():
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not explicit and path.is_symlink():
        raise CacheDirError(
            f"cache directory {path} is a symlink; refusing to use it (someone else may control "
            "its target). Remove it, or set TINY_CACHE_DIR to a directory you own"
        )
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise CacheDirError(f"cache path {path} exists but is not a directory; remove it or set TINY_CACHE_DIR")
    if hasattr(os, "getuid") and st.st_uid != os.getuid():
        raise CacheDirError(
            f"cache directory {path} belongs to uid {st.st_uid}, not to you (uid {os.getuid()}); "
            "loading code from it would be unsafe. Set TINY_CACHE_DIR to a directory you own"
        )
    if stat.S_IMODE(st.st_mode) & 0o077:
        warnings.warn(f"cache directory {path} had mode {oct(stat.S_IMODE(st.st_mode))}; resetting it to 0o700")
        os.chmod(path, 0o700)
    return path


def cache_dir() -> Path:
    """The per-user cache root (``$TINY_CACHE_DIR`` or the default), created/checked as 0700."""
    env = os.environ.get("TINY_CACHE_DIR")
    root = Path(env).expanduser() if env else _default_cache_dir()
    return _secure_dir(root, explicit=bool(env))


def _subdir(name: str) -> Path:
    sub = cache_dir() / name
    if not sub.is_dir():
        sub.mkdir(mode=0o700, exist_ok=True)
    return sub


def code_hash(*parts: str) -> str:
    """A short, file-name-safe content hash of ``parts`` (each part delimited, so order matters)."""
    h = hashlib.sha256()
    for part in parts:
        data = part.encode()
        h.update(len(data).to_bytes(8, "little"))
        h.update(data)
    return h.hexdigest()[:40]


def write_atomic(path: Path, data: bytes) -> None:
    """Write ``data`` to ``path`` so readers see the old file or the whole new one, never a part."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def _sha256_file(path: Path) -> str | None:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()
    except OSError:
        return None


def entry_is_intact(library: Path, checksum: Path) -> bool:
    """True when ``library`` exists and its SHA-256 is the one recorded in ``checksum``.

    The checksum file is written only after the library is complete, so a missing checksum
    means an interrupted build, and a mismatch means a truncated or overwritten library.
    """
    try:
        expected = checksum.read_text().strip()
    except OSError:
        return False
    return bool(expected) and _sha256_file(library) == expected


#: appended to every C++ source the cache builds: the library then carries the key it is stored
#: under, and a library found under another key (two entries swapped) is rebuilt, never loaded
_KEY_SYMBOL = 'extern "C" __attribute__((used, visibility("default"))) const char tiny_cache_key[] = "{key}";\n'


def library_has_key(library: Path, key: str) -> bool:
    """True when ``library`` was built for ``key`` (its ``tiny_cache_key`` string holds it). The
    checksum proves the file is whole; this proves it is the entry its name says."""
    try:
        return f"{key}\0".encode() in library.read_bytes()
    except OSError:
        return False


class PyCodeCache:
    """Generated Python (wrappers, Triton kernels) -> ``<hash>.py`` -> an imported module.

    The source is written to a real file because ``triton.jit`` and ``inspect`` read kernels
    back from their file. The module is executed from the verified in-memory source, so a
    stale ``__pycache__`` can never be picked up.
    """

    modules: dict[str, types.ModuleType] = {}
    stats: collections.Counter = collections.Counter()

    @classmethod
    def path_for(cls, source: str) -> Path:
        return _subdir("py") / f"{code_hash('py', source)}.py"

    @classmethod
    def load(cls, source: str) -> types.ModuleType:
        """Write ``source`` to the cache (unless an intact copy is there) and import it."""
        path = cls.path_for(source)
        if str(path) in cls.modules:
            cls.stats["memory_hit"] += 1
            return cls.modules[str(path)]
        data = source.encode()
        try:
            stored = path.read_bytes()
        except FileNotFoundError:
            stored = None
        if stored == data:
            cls.stats["disk_hit"] += 1
        else:
            if stored is not None:
                cls.stats["corrupt"] += 1
            cls.stats["miss"] += 1
            write_atomic(path, data)  # racing writers write identical bytes: harmless
        name = f"tininductor_cache_{path.stem}"
        module = types.ModuleType(name)
        module.__file__ = str(path)
        # Serve inspect/triton the exact source we verified, whatever happens to the file later.
        linecache.cache[str(path)] = (len(source), None, source.splitlines(keepends=True), str(path))
        sys.modules[name] = module
        exec(compile(source, str(path), "exec"), module.__dict__)
        cls.modules[str(path)] = module
        return module

    @classmethod
    def clear(cls) -> None:
        """Forget loaded modules and counters (files on disk stay)."""
        cls.modules.clear()
        cls.stats.clear()


class CppCodeCache:
    """Generated C++ -> ``<hash>.cpp`` -> g++ -> ``<hash>.so`` (+ ``<hash>.sha256``) -> ``ctypes.CDLL``.

    The hash covers the source, the headers it includes, extra flags, the compiler binary,
    the CPU features and the OpenMP setting, so a cache shared between machines never loads
    code built for another CPU. ``headers`` ({file name: text}) are written to a directory
    of their own (keyed by their content) and precompiled once, so each kernel build skips
    parsing them.
    """

    libraries: dict[str, ctypes.CDLL] = {}
    stats: collections.Counter = collections.Counter()

    @classmethod
    def key(cls, source: str, extra_flags: tuple[str, ...] = (), headers: dict[str, str] | None = None) -> str:
        cxx = cpp_builder.find_compiler()
        return code_hash(
            "cpp", source, " ".join(extra_flags), cpp_builder.compiler_identity(cxx),
            cpp_builder.machine_signature(), str(cpp_builder.openmp_requested()), str(cpp_builder.libmvec_requested()),
            os.environ.get("TINY_CPP_FLAGS", ""), *(f"{n}\0{t}" for n, t in sorted((headers or {}).items())),
        )

    @classmethod
    def paths(cls, source: str, extra_flags: tuple[str, ...] = (), headers: dict[str, str] | None = None) -> dict[str, Path]:
        """The files of one entry: ``cpp`` (source), ``so`` (library), ``sha256``, ``lock``."""
        base = _subdir("cpp") / cls.key(source, tuple(extra_flags), headers)
        return {ext: base.with_suffix(f".{ext}") for ext in ("cpp", "so", "sha256", "lock")}

    @classmethod
    def load(cls, source: str, extra_flags: tuple[str, ...] = (), headers: dict[str, str] | None = None) -> ctypes.CDLL:
        """Build ``source`` into a shared library (unless a verified one is cached) and load it."""
        p = cls.paths(source, tuple(extra_flags), headers)
        if str(p["so"]) in cls.libraries:
            cls.stats["memory_hit"] += 1
            return cls.libraries[str(p["so"])]
        with FileLock(str(p["lock"])):
            if entry_is_intact(p["so"], p["sha256"]) and library_has_key(p["so"], p["so"].stem):
                cls.stats["disk_hit"] += 1
            else:
                if p["so"].exists() or p["sha256"].exists():
                    cls.stats["corrupt"] += 1
                cls.stats["miss"] += 1
                cls._build(source, p, tuple(extra_flags), headers or {})
            lib = ctypes.CDLL(str(p["so"]))
        cls.libraries[str(p["so"])] = lib
        return lib

    @classmethod
    def include_dir(cls, headers: dict[str, str], extra_flags: tuple[str, ...] = ()) -> Path:
        """A directory holding ``headers`` (verified) and their precompiled ``.gch`` files."""
        d = _subdir("cpp") / f"include-{cls.key('', extra_flags, headers)}"
        d.mkdir(mode=0o700, exist_ok=True)
        with FileLock(str(d) + ".lock"):
            for name, text in headers.items():
                path, gch = d / name, d / f"{name}.gch"
                if not path.exists() or path.read_text() != text:
                    write_atomic(path, text.encode())
                    if gch.exists():
                        gch.unlink()
                if not gch.exists():
                    fd, tmp = tempfile.mkstemp(dir=d, prefix=f".{gch.name}.", suffix=".tmp")
                    os.close(fd)
                    try:
                        if cpp_builder.precompile_header(str(path), tmp, extra_flags=extra_flags):
                            os.replace(tmp, gch)
                    finally:
                        if os.path.exists(tmp):
                            os.unlink(tmp)
        return d

    @classmethod
    @timed("cpp_build")
    def _build(cls, source: str, p: dict[str, Path], extra_flags: tuple[str, ...], headers: dict[str, str]) -> None:
        write_atomic(p["cpp"], (source + "\n" + _KEY_SYMBOL.format(key=p["so"].stem)).encode())
        flags = extra_flags
        if headers:
            include = cls.include_dir(headers, extra_flags)
            flags = (*extra_flags, f"-I{include}")
        fd, tmp_so = tempfile.mkstemp(dir=p["so"].parent, prefix=f".{p['so'].name}.", suffix=".tmp")
        os.close(fd)
        try:
            try:
                cpp_builder.build_shared_library(str(p["cpp"]), tmp_so, extra_flags=flags)
            except cpp_builder.CppCompileError:
                if not headers:
                    raise
                for gch in include.glob("*.gch"):   # a bad precompiled header: retry from the text
                    gch.unlink()
                cpp_builder.build_shared_library(str(p["cpp"]), tmp_so, extra_flags=flags)
            digest = _sha256_file(Path(tmp_so))
            os.replace(tmp_so, p["so"])
        finally:
            if os.path.exists(tmp_so):
                os.unlink(tmp_so)
        write_atomic(p["sha256"], f"{digest}\n".encode())  # written last: marks the entry complete

    @classmethod
    def clear(cls) -> None:
        """Forget loaded libraries and counters (files on disk stay)."""
        cls.libraries.clear()
        cls.stats.clear()
