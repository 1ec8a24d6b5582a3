"""Code cache: per-user 0700 directory, reuse across calls and processes, corruption, concurrency."""
import json
import os
import stat
import subprocess
import sys
import textwrap
import uuid

import pytest

from tininductor import codecache, cpp_builder
from tininductor.codecache import CppCodeCache, PyCodeCache

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
    root = tmp_path / "cache"
    monkeypatch.setenv("TINY_CACHE_DIR", str(root))
    PyCodeCache.clear()
    CppCodeCache.clear()
    yield root
    PyCodeCache.clear()
    CppCodeCache.clear()


def _cpp_source(tag: str) -> str:
    # a unique tag makes each test's kernel a fresh cache key
    return textwrap.dedent(f"""
        // {tag}
        extern "C" long scaled_sum(const long* x, long n, long k) {{
            long total = 0;
            #pragma omp parallel for reduction(+:total)
            for (long i = 0; i < n; ++i) total += k * x[i];
            return total;
        }}
    """)


def _call_scaled_sum(lib, values, k):
    import ctypes
    arr = (ctypes.c_long * len(values))(*values)
    lib.scaled_sum.restype = ctypes.c_long
    return lib.scaled_sum(arr, ctypes.c_long(len(values)), ctypes.c_long(k))


def test_cache_dir_created_0700(fresh_cache):
    root = codecache.cache_dir()
    assert root == fresh_cache
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700


def test_cache_dir_loose_mode_is_repaired(fresh_cache):
    fresh_cache.mkdir(mode=0o755)
    os.chmod(fresh_cache, 0o777)
    with pytest.warns(UserWarning, match="resetting it to 0o700"):
        codecache.cache_dir()
    assert stat.S_IMODE(os.stat(fresh_cache).st_mode) == 0o700


@pytest.mark.skipif(not hasattr(os, "getuid") or os.getuid() != 0, reason="needs root to chown")
def test_cache_dir_foreign_owner_refused(fresh_cache):
    fresh_cache.mkdir(mode=0o700)
    os.chown(fresh_cache, 65534, 65534)
    with pytest.raises(codecache.CacheDirError, match="TINY_CACHE_DIR"):
        codecache.cache_dir()


def test_py_cache_hits_and_corruption(fresh_cache):
    src = f"# {uuid.uuid4()}\ndef f(x):\n    return x * 3 + 1\n"
    mod = PyCodeCache.load(src)
    assert mod.f(2) == 7 and PyCodeCache.stats["miss"] == 1
    assert PyCodeCache.load(src) is mod and PyCodeCache.stats["memory_hit"] == 1
    path = PyCodeCache.path_for(src)
    assert path.read_text() == src and path.parent.parent == fresh_cache

    PyCodeCache.clear()  # a "new run": same file on disk
    assert PyCodeCache.load(src).f(2) == 7
    assert dict(PyCodeCache.stats) == {"disk_hit": 1}

    PyCodeCache.clear()
    path.write_text(src[: len(src) // 2])  # truncated: would be a SyntaxError if imported
    assert PyCodeCache.load(src).f(5) == 16
    assert PyCodeCache.stats["corrupt"] == 1 and PyCodeCache.stats["miss"] == 1
    assert path.read_text() == src


def test_py_cache_source_readable_by_inspect():
    import inspect
    src = f"# {uuid.uuid4()}\ndef kernel(a):\n    return a - 1\n"
    mod = PyCodeCache.load(src)
    assert "return a - 1" in inspect.getsource(mod.kernel)


def test_cpp_cache_build_hit_and_corruption():
    src = _cpp_source(str(uuid.uuid4()))
    lib = CppCodeCache.load(src)
    assert _call_scaled_sum(lib, [1, 2, 3, 4], 2) == 20
    assert CppCodeCache.stats["miss"] == 1
    assert CppCodeCache.load(src) is lib and CppCodeCache.stats["memory_hit"] == 1
    paths = CppCodeCache.paths(src)
    assert paths["cpp"].read_text().startswith(src) and paths["so"].exists() and paths["sha256"].exists()

    CppCodeCache.clear()
    CppCodeCache.load(src)
    assert dict(CppCodeCache.stats) == {"disk_hit": 1}

    CppCodeCache.clear()
    good = paths["so"].read_bytes()
    paths["so"].unlink()  # (a new inode: the loaded library stays mapped)
    paths["so"].write_bytes(good[: len(good) // 3])  # truncated library: must not be dlopen'ed
    CppCodeCache.load(src)
    assert CppCodeCache.stats["corrupt"] == 1 and CppCodeCache.stats["miss"] == 1
    assert codecache._sha256_file(paths["so"]) == paths["sha256"].read_text().strip()

    CppCodeCache.clear()
    paths["sha256"].unlink()  # interrupted before the entry was marked complete
    CppCodeCache.load(src)
    assert CppCodeCache.stats["miss"] == 1


def test_cpp_cache_swapped_entries_are_rebuilt_not_served():
    """Two entries swapped on disk (library and checksum together, each pair intact): each library
    carries the key it was built for, so neither is served under the other's name."""
    tag = str(uuid.uuid4())
    src_a = _cpp_source(tag + "a")
    src_b = _cpp_source(tag + "b").replace("k * x[i]", "(k + 1) * x[i]")
    CppCodeCache.load(src_a), CppCodeCache.load(src_b)
    pa, pb = CppCodeCache.paths(src_a), CppCodeCache.paths(src_b)
    for ext in ("so", "sha256"):  # new inodes: the loaded libraries stay mapped
        da, db = pa[ext].read_bytes(), pb[ext].read_bytes()
        pa[ext].unlink(), pb[ext].unlink()
        pa[ext].write_bytes(db), pb[ext].write_bytes(da)
    assert codecache.entry_is_intact(pa["so"], pa["sha256"])  # the checksum alone cannot tell
    CppCodeCache.clear()
    assert _call_scaled_sum(CppCodeCache.load(src_a), [1, 2, 3, 4], 2) == 20
    assert _call_scaled_sum(CppCodeCache.load(src_b), [1, 2, 3, 4], 2) == 30
    assert CppCodeCache.stats["corrupt"] == 2 and CppCodeCache.stats["miss"] == 2


_CHILD = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {repo!r})
    from tininductor.codecache import CppCodeCache
    import ctypes
    lib = CppCodeCache.load({src!r})
    arr = (ctypes.c_long * 5)(1, 2, 3, 4, 5)
    lib.scaled_sum.restype = ctypes.c_long
    print(json.dumps({{"result": lib.scaled_sum(arr, ctypes.c_long(5), ctypes.c_long(3)),
                      "stats": dict(CppCodeCache.stats)}}))
""")


def _child_cmd(src):
    return [sys.executable, "-c", _CHILD.format(repo=REPO, src=src)]


def test_cpp_cache_reused_by_second_process():
    src = _cpp_source(str(uuid.uuid4()))
    runs = [json.loads(subprocess.run(_child_cmd(src), capture_output=True, text=True, check=True).stdout)
            for _ in range(2)]
    assert [r["result"] for r in runs] == [45, 45]
    assert runs[0]["stats"] == {"miss": 1}
    assert runs[1]["stats"] == {"disk_hit": 1}


def test_cpp_cache_concurrent_processes_build_once():
    src = _cpp_source(str(uuid.uuid4()))
    procs = [subprocess.Popen(_child_cmd(src), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for _ in range(2)]
    outs = []
    for p in procs:
        stdout, stderr = p.communicate(timeout=120)
        assert p.returncode == 0, stderr
        outs.append(json.loads(stdout))
    assert [o["result"] for o in outs] == [45, 45]
    assert sorted(o["stats"].get("miss", 0) for o in outs) == [0, 1]  # one built, the other reused
    assert all(not o["stats"].get("corrupt") for o in outs)


def test_cpp_compile_error_is_clear():
    with pytest.raises(cpp_builder.CppCompileError, match="C\\+\\+ compilation failed"):
        CppCodeCache.load("extern \"C\" int broken( { return; }")


def test_cpp_without_openmp_falls_back(monkeypatch):
    monkeypatch.setenv("TINY_CPP_OPENMP", "0")
    assert "-fopenmp" not in cpp_builder.compile_flags()
    src = _cpp_source("no-openmp " + str(uuid.uuid4()))
    assert _call_scaled_sum(CppCodeCache.load(src), [1, 2, 3], 10) == 60


def test_cpp_headers_are_precompiled_and_a_bad_pch_is_survived():
    header = {"tiny_test_helpers.h": "#include <cmath>\nstatic inline double twice(double x) { return 2 * x; }\n"}
    src = '#include "tiny_test_helpers.h"\nextern "C" double f(double x) { return twice(x) + std::sqrt(x); }\n'
    import ctypes
    lib = CppCodeCache.load(src, headers=header)
    lib.f.restype, lib.f.argtypes = ctypes.c_double, [ctypes.c_double]
    assert lib.f(4.0) == 10.0
    include = CppCodeCache.include_dir(header)
    gch = include / "tiny_test_helpers.h.gch"
    assert gch.exists() and (include / "tiny_test_helpers.h").read_text() == header["tiny_test_helpers.h"]
    gch.write_bytes(gch.read_bytes()[:1000])  # a truncated precompiled header
    src2 = src.replace("+ std::sqrt(x)", "- std::sqrt(x)")
    lib2 = CppCodeCache.load(src2, headers=header)
    lib2.f.restype, lib2.f.argtypes = ctypes.c_double, [ctypes.c_double]
    assert lib2.f(4.0) == 6.0
    # the header text is part of the key: a changed header is a different entry
    assert CppCodeCache.key(src, headers=header) != CppCodeCache.key(src, headers={"tiny_test_helpers.h": "//"})


def test_default_cache_dir_under_home_and_symlink_refused(tmp_path, monkeypatch):
    monkeypatch.delenv("TINY_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    (tmp_path / "home").mkdir()
    root = codecache.cache_dir()
    assert root == tmp_path / "home" / ".cache" / "tininductor"
    assert stat.S_IMODE(os.stat(root).st_mode) == 0o700
    # a symlink at the default location could point anywhere: refuse it
    os.rename(root, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", root)
    with pytest.raises(codecache.CacheDirError, match="symlink"):
        codecache.cache_dir()
