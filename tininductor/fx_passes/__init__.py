"""Graph-level passes over prim graphs, each switched by a ``tininductor.config`` flag named like
TorchInductor's: ``freezing`` (parameters as constants, folded; batch norm folded into the
convolution before it), ``constant_folding`` (what reads no graph input computed once, at
compile time), ``shape_padding`` (matmul operands padded to aligned sizes)."""
