"""Graded tests for chapter 9 (C++ code generation and the code cache).

Each test plugs the chapter's function into tininductor's real C++ path (compile_fx with the
"cpp" CPU backend, g++, ctypes, the code cache) and compares with eager PyTorch.
"""
import ctypes
import uuid

import pytest
import torch

from course import load
from course.testing import expect_close, expect_equal, expect_raises, expect_true
from tininductor.codecache import cache_dir

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture
def ch():
    return load("ch09")


@pytest.fixture(autouse=True)
def _cpp_backend(monkeypatch):
    monkeypatch.setenv("TINY_CPU_BACKEND", "cpp")
    # a code cache of its own, kept between gradings: the precompiled prelude and every kernel are
    # built once (entries are keyed by their source, so your changed op strings build new ones), and
    # apart from the compiler's own cache, which your write_atomic and entry_is_intact never touch
    monkeypatch.setenv("TINY_CACHE_DIR", str(cache_dir().with_name(f"{cache_dir().name}-graded")))
    from tininductor.codecache import CppCodeCache, PyCodeCache

    CppCodeCache.clear()
    PyCodeCache.clear()


def _compile(fn, *args):
    from tininductor.testing import compile_graph

    return compile_graph(fn, args)


@pytest.mark.ch09_1
def test_op_strings_in_the_cpp_backend(ch, monkeypatch):
    from tininductor.codegen import cpp

    strings = ch.cpp_op_strings()
    expect_equal(sorted(strings), ["maximum", "relu", "rsqrt", "sigmoid", "where"], "ops you defined")
    for op, template in strings.items():
        monkeypatch.setitem(cpp.CPP_OPS, op, template)

    def f(x, y):
        return torch.sigmoid(x), torch.relu(x), torch.maximum(x, y), torch.where(x > y, x, y), torch.rsqrt(x.abs() + 1)

    x, y = torch.randn(5, 7), torch.randn(7)
    x[0, 0], y[3] = float("nan"), float("nan")
    compiled = _compile(f, x, y)
    names = ["sigmoid", "relu", "maximum", "where", "rsqrt"]
    for name, yours, expected in zip(names, compiled(x, y), f(x, y)):
        expect_close(yours, expected, f"{name}(x) from your C++ string", context=getattr(compiled, "source", ""), equal_nan=True)


@pytest.mark.ch09_1
def test_op_strings_at_signed_zeros_and_large_values(ch, monkeypatch):
    """rsqrt(-0.0) is -inf and rsqrt(0.0) inf; sigmoid(+-100) is 1 and 0, where exp overflows in float."""
    from tininductor.codegen import cpp

    for op, template in ch.cpp_op_strings().items():
        monkeypatch.setitem(cpp.CPP_OPS, op, template)

    def f(x):
        return torch.rsqrt(x), torch.sigmoid(x)

    x = torch.tensor([-0.0, 0.0, 0.25, 4.0, 100.0, -100.0, 1e-3])
    compiled = _compile(f, x)
    for name, yours, expected in zip(["rsqrt", "sigmoid"], compiled(x), f(x)):
        expect_close(yours, expected, f"{name}(x) from your C++ string for x = [-0.0, 0.0, 0.25, 4.0, 100.0, -100.0, 1e-3]",
                     context=getattr(compiled, "source", ""), equal_nan=True)


@pytest.mark.ch09_2
def test_reduction_code_in_the_cpp_backend(ch, monkeypatch):
    from tininductor.codegen import cpp

    init, update, omp = ch.reduction_code("sum", "double")
    expect_true("{acc}" in update and "{value}" in update, "the update statement keeps {acc} and {value}", update)
    monkeypatch.setattr(cpp, "reduction_code", ch.reduction_code)

    def f(x):
        return x.sum(-1), x.amax(-1), x.amin(0), x.prod(-1), torch.softmax(x, -1)

    x = torch.randn(6, 37) * 0.2 + 1
    x[2, 5] = float("nan")
    compiled = _compile(f, x)
    names = ["sum", "amax", "amin", "prod", "softmax"]
    for name, yours, expected in zip(names, compiled(x), f(x)):
        expect_close(yours, expected, f"{name} with your reduction code", context=getattr(compiled, "source", ""),
                     equal_nan=True, atol=1e-5, rtol=1e-5)
    ints = torch.randint(-9, 9, (4, 11))
    compiled = _compile(lambda t: (t.amax(-1), t.sum(-1)), ints)
    expect_close(compiled(ints), (ints.amax(-1), ints.sum(-1)), "int64 max/sum with your reduction code")
    # the identities: a max of negative values, a min of values above zero, for floats and integers
    neg, pos = -torch.rand(5, 9) - 1, torch.rand(5, 9) + 1
    compiled = _compile(lambda a, b: (a.amax(-1), b.amin(-1), a.prod(-1)), neg, pos)
    expect_close(compiled(neg, pos), (neg.amax(-1), pos.amin(-1), neg.prod(-1)), "max of negatives, min of positives")
    ninf = torch.full((3, 5), float("-inf"))
    ninf[1, 2] = 0.5  # one row with a finite value, the others all -inf
    compiled = _compile(lambda t: (t.amax(-1), (-t).amin(-1)), ninf)
    expect_close(compiled(ninf), (ninf.amax(-1), (-ninf).amin(-1)),
                 "max of rows that are all -inf (and min of rows all +inf): expected -inf / inf, not the lowest float")
    ineg = torch.randint(-50, -1, (3, 7))
    compiled = _compile(lambda t: (t.amax(-1), (-t).amin(-1)), ineg)
    expect_close(compiled(ineg), (ineg.amax(-1), (-ineg).amin(-1)), "int64 max of negatives, min of positives")


@pytest.mark.ch09_3
def test_row_sum_kernel(ch):
    from tininductor.codecache import CppCodeCache

    name = "row_sum_" + uuid.uuid4().hex[:8]
    source = ch.row_sum_source(name)
    expect_true("#pragma omp parallel for" in source, "the row loop is `#pragma omp parallel for`", source)
    expect_true("simd" in source and "reduction(+:" in source,
                "the inner loop is `#pragma omp simd reduction(+:acc)`", source)
    fn = getattr(CppCodeCache.load(source), name)
    fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int64, ctypes.c_int64]
    # a tall input first: a kernel that mixes up rows and cols still reads and writes inside the buffers there
    for rows, cols in [(1, 1), (8, 3), (7, 33), (64, 1000), (3, 0), (1, 100003)]:
        x = torch.randn(rows, cols)
        out = torch.full((rows,), float("nan"))
        fn(x.data_ptr(), out.data_ptr(), rows, cols)
        expect_close(out, x.sum(-1), f"row sums of a {rows}x{cols} input", atol=1e-4, rtol=1e-5)
    # 2**24 + 1 is 2**24 in float: a float accumulator loses every 1 added after the big values
    big = 2.0**24
    x = torch.tensor([[big] * 16 + [1.0] * 1000 + [-big] * 16])
    out = torch.full((1,), float("nan"))
    fn(x.data_ptr(), out.data_ptr(), 1, x.shape[1])
    expect_close(out, torch.tensor([1000.0]), "row sum of [2**24 (16 times), 1.0 (1000 times), -2**24 (16 times)]"
                 " (accumulate in double)", atol=1e-4, rtol=1e-5)


@pytest.mark.ch09_4
def test_write_atomic_in_the_code_cache(ch, tmp_path, monkeypatch):
    target = tmp_path / "entry.bin"
    ch.write_atomic(target, b"first")
    ch.write_atomic(target, b"second version")
    expect_equal(target.read_bytes(), b"second version", "file content after two writes")
    expect_raises(Exception, lambda: ch.write_atomic(target, "not bytes"),  # a failing write...
                  "write_atomic(entry.bin, 'not bytes') (a str, not bytes: the write fails)")
    expect_equal(target.read_bytes(), b"second version", "content after a failed write (old file kept)")
    ch.write_atomic(target, b"")
    expect_equal(target.read_bytes(), b"", "entry.bin after write_atomic(entry.bin, b'') (an empty file is content too)")
    ch.write_atomic(target, b"second version")
    expect_equal(sorted(p.name for p in tmp_path.iterdir()), ["entry.bin"], "files left in the directory (no temporaries)")

    import tininductor.codecache as codecache

    monkeypatch.setattr(codecache, "write_atomic", ch.write_atomic)
    compiled = _compile(lambda a: (a * 3).cos(), torch.randn(9))
    x = torch.randn(9)
    expect_close(compiled(x), (x * 3).cos(), "a kernel built through your write_atomic")
    # the cache outlives a grading run, so the kernel above may be a disk hit: build a new entry too
    src = f'// {uuid.uuid4()}\nextern "C" int answer() {{ return 42; }}\n'
    expect_equal(codecache.CppCodeCache.load(src).answer(), 42,
                 "answer() of a new cache entry whose .cpp and .sha256 your write_atomic wrote")
    paths = codecache.CppCodeCache.paths(src)
    expect_true(codecache.entry_is_intact(paths["so"], paths["sha256"]),
                f"the new entry {paths['so'].name} matches the checksum your write_atomic wrote")


@pytest.mark.ch09_4
def test_write_atomic_survives_a_crash_between_write_and_rename(ch, tmp_path, monkeypatch):
    """A crash (here: os.replace raising) at any moment leaves either the old file or the new one, whole;
    the data reaches the disk (os.fsync) before the rename; the temporary lives beside the target (a rename
    within one filesystem is atomic, across two it is a copy)."""
    import os

    target = tmp_path / "entry.bin"
    target.write_bytes(b"old version")
    calls = []
    real_replace, real_fsync = os.replace, os.fsync

    def crash(src, dst):
        calls.append(("replace", os.fspath(src), os.fspath(dst)))
        raise OSError("simulated crash between the write and the rename")

    def fsync(fd):
        calls.append(("fsync",))
        return real_fsync(fd)

    monkeypatch.setattr(os, "replace", crash)
    monkeypatch.setattr(os, "fsync", fsync)
    expect_raises(OSError, lambda: ch.write_atomic(target, b"new version"),
                  "write_atomic(entry.bin, b'new version') when os.replace raises OSError (pass it on)")
    monkeypatch.setattr(os, "replace", real_replace)
    expect_equal(target.read_bytes(), b"old version",
                 "entry.bin after a crash just before the rename of write_atomic(entry.bin, b'new version') (old file kept)")
    renames = [c for c in calls if c[0] == "replace"]
    expect_equal(len(renames), 1, "os.replace calls of write_atomic(entry.bin, ...)")
    expect_equal(os.path.dirname(renames[0][1]), str(tmp_path),
                 "folder of the temporary file write_atomic renames (the target's own folder)")
    expect_true(("fsync",) in calls[:calls.index(renames[0])],
                "write_atomic(entry.bin, ...) must os.fsync the data before the rename (else a crash can leave "
                "a renamed but empty file)")


@pytest.mark.ch09_5
def test_entry_is_intact_with_odd_files(ch, tmp_path):
    import hashlib

    lib, check = tmp_path / "k.so", tmp_path / "k.sha256"
    lib.write_bytes(bytes(range(256)))  # not text
    check.write_text(hashlib.sha256(bytes(range(256))).hexdigest() + " \r\n")
    expect_equal(ch.entry_is_intact(lib, check), True,
                 "entry_is_intact of a binary library whose checksum file ends with ' \\r\\n'")
    lib.write_bytes(b"")
    check.write_text(hashlib.sha256(b"").hexdigest() + "\n")
    expect_equal(ch.entry_is_intact(lib, check), True, "entry_is_intact of an empty library whose checksum matches")
    lib.unlink()
    lib.mkdir()
    expect_equal(ch.entry_is_intact(lib, check), False, "entry_is_intact when the library path is a folder")


@pytest.mark.ch09_5
def test_entry_is_intact_in_the_code_cache(ch, tmp_path, monkeypatch):
    lib, check = tmp_path / "k.so", tmp_path / "k.sha256"
    expect_equal(ch.entry_is_intact(lib, check), False, "entry_is_intact with no files")
    lib.write_bytes(b"library bytes")
    import hashlib

    check.write_text(hashlib.sha256(b"library bytes").hexdigest() + "\n")
    expect_equal(ch.entry_is_intact(lib, check), True, "entry_is_intact of a matching pair")
    lib.write_bytes(b"library")
    expect_equal(ch.entry_is_intact(lib, check), False, "entry_is_intact of a truncated library")
    check.write_text("")
    expect_equal(ch.entry_is_intact(lib, check), False, "entry_is_intact with an empty checksum file")
    check.unlink()
    expect_equal(ch.entry_is_intact(lib, check), False, "entry_is_intact with the checksum file missing")

    import tininductor.codecache as codecache
    from tininductor.codecache import CppCodeCache

    monkeypatch.setattr(codecache, "entry_is_intact", ch.entry_is_intact)
    src = f'// {uuid.uuid4()}\nextern "C" int answer() {{ return 42; }}\n'
    expect_equal(CppCodeCache.load(src).answer(), 42, "a freshly built kernel")
    CppCodeCache.clear()
    CppCodeCache.load(src)
    expect_equal(dict(CppCodeCache.stats), {"disk_hit": 1}, "cache counters on a second run")
    so = CppCodeCache.paths(src)["so"]
    truncated = so.read_bytes()[:100]
    so.unlink()  # a new inode: the loaded library stays mapped in this process
    so.write_bytes(truncated)
    CppCodeCache.clear()
    CppCodeCache.load(src)
    expect_equal(dict(CppCodeCache.stats), {"corrupt": 1, "miss": 1}, "cache counters after truncating the .so")
