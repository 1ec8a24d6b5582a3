"""The scheduler's placement rules: which kernel a buffer joins when its producer's kernel is not
an option, and how large a kernel may grow. Each decision is checked against eager too."""
import pytest
import torch

from course.chapters.ch07_loop_ir import lower_and_schedule
from tininductor import config
from tininductor.scheduler import FusedGroup
from tininductor.testing import DEVICE, check, compile_graph, patch_config

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def kernels_of(sched) -> list[list[str]]:
    """Each kernel's buffers, by name, in order."""
    return [[n.get_name() for n in g.nodes] for g in sched.nodes if isinstance(g, FusedGroup)]


def saved_sum_input(x, y, u, w):
    """``x + y`` is computed inside the sum's kernel and is also an output (as a training graph
    saves an activation for the backward): its buffer is realized last, after an unrelated kernel."""
    a = x + y
    return a.sum(-1), torch.mm(u, w) * 2, a


def saved_sum_input_args():
    return [torch.randn(8, 32, device=DEVICE), torch.randn(8, 32, device=DEVICE),
            torch.randn(8, 16, device=DEVICE), torch.randn(16, 32, device=DEVICE)]


def test_a_buffer_joins_the_kernel_that_reads_what_it_reads():
    graph, sched = lower_and_schedule(saved_sum_input, saved_sum_input_args())
    by_buffer = {name: i for i, names in enumerate(kernels_of(sched)) for name in names}
    reduction = next(b.get_name() for b in graph.buffers if getattr(b, "is_reduction", lambda: False)())
    output_a = graph.graph_outputs[2].get_name()
    mul = graph.graph_outputs[1].get_name()
    # the latest kernel (the mul after the mm) would take it too, but shares no load with it
    assert by_buffer[output_a] == by_buffer[reduction] != by_buffer[mul], kernels_of(sched)
    check(saved_sum_input, *saved_sum_input_args())


def many_outputs(x, y):
    return tuple(x * i + y for i in range(7))


def test_no_kernel_grows_beyond_max_fusion_size():
    args = [torch.randn(16, 16, device=DEVICE), torch.randn(16, 16, device=DEVICE)]
    _, sched = lower_and_schedule(many_outputs, args)
    assert [len(k) for k in kernels_of(sched)] == [7]  # independent siblings share one kernel...
    with patch_config(config, max_fusion_size=3):
        _, sched = lower_and_schedule(many_outputs, args)
        assert [len(k) for k in kernels_of(sched)] == [3, 3, 1]  # ...up to the cap
        compiled = compile_graph(many_outputs, args)
        torch.testing.assert_close(compiled(*args), many_outputs(*args))
        assert len(compiled.kernels) == 3
