"""A compiled module answers ``bool()`` as the original does: an empty ``ModuleList`` stays false
(``if compiled_layers:`` takes the same branch as with the original)."""
from torch import nn

import tinydynamo


def test_compiled_module_truth_is_the_originals():
    for original in (nn.ModuleList(), nn.ModuleList([nn.Linear(2, 2)]), nn.Linear(2, 2), nn.Sequential()):
        assert bool(tinydynamo.compile(original, backend="eager")) is bool(original)
