"""The notebooks' diagrams (course/pictures.py) and timing spreads (course/benchmark.py) say what
they claim: the values a partition saves are the ones drawn as saved, every kernel appears in
each CUDA-graph row, and a spread's min <= median <= max over every timed batch."""
import re

import torch

from course import benchmark, pictures


def _fill_of(dot_source: str, name: str) -> str:
    match = re.search(rf'^\s*{re.escape(name)} \[.*fillcolor="(#[0-9a-f]+)"', dot_source, re.M)
    assert match, f"node {name} not drawn"
    return match.group(1)


def test_partition_picture_marks_what_the_partition_saves():
    from tininductor.decompositions import decompose, fake_inputs
    from tininductor.joint_graph import create_joint
    from tininductor.partitioners import default_partition, min_cut_partition

    def block(x, w, b):
        return torch.nn.functional.gelu(torch.layer_norm(x, (8,)) * w + b).sum(-1)

    inputs = [torch.randn(4, 8, requires_grad=True), torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)]
    fakes, mode = fake_inputs(inputs)
    joint = create_joint(decompose(block, fakes), fakes, [True] * 3, mode)
    for partition in (default_partition(joint), min_cut_partition(joint)):
        source = pictures.partition_dot(joint, partition, "t").source
        for name in partition.saved:
            assert _fill_of(source, name) == pictures.COLOURS["saved"]
        forward_only = {n.name for n in partition.fw_gm.graph.nodes} - {n.name for n in partition.bw_gm.graph.nodes}
        for name in forward_only - set(partition.saved):
            if not name.startswith(("primals", "output")):
                assert _fill_of(source, name) == pictures.COLOURS["forward"]
        assert "tangents" not in source  # the backward is one box
    assert default_partition(joint).saved != min_cut_partition(joint).saved


def test_cudagraph_picture_has_every_kernel_in_each_row():
    source = pictures.cudagraph_dot(["k_alpha", "k_beta"]).source
    assert source.count("k_alpha") == 3 and source.count("k_beta") == 3  # default, record, replay
    assert len(re.findall(r"default_l\d+ \[label=launch", source)) == 2  # one launch per kernel
    assert source.count("graph.replay()") == 1


def test_spread_keeps_every_batch():
    calls = []
    spread = benchmark.bench_spread(lambda: calls.append(1), (), "cpu", warmup=2, iters=3, repeats=4)
    assert len(spread.samples) == 4 and len(calls) == 2 + 3 * 4
    assert spread.min <= spread.median <= spread.max
    assert benchmark.Spread((1e-6, 3e-6, 2e-6)).format() == "1-3"


def test_timing_holds_the_garbage_collector_back():
    """While batches are timed the cyclic collector is off (a full collection would be charged to
    whichever callable it interrupts); afterwards it is as it was."""
    import gc

    seen = []
    timings = benchmark.bench_interleaved({"a": lambda: seen.append(gc.isenabled()), "b": lambda: None}, (), "cpu",
                                          warmup=1, iters=2, repeats=2, min_sample_s=0)
    assert set(timings) == {"a", "b"} and gc.isenabled()
    assert seen[-4:] == [False] * 4  # every timed call
    benchmark.bench_spread(lambda: seen.append(gc.isenabled()), (), "cpu", warmup=0, iters=1, repeats=2)
    assert seen[-2:] == [False, False] and gc.isenabled()
