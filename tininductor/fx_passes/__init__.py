"""Graph-level passes over prim graphs, each switched by a ``tininductor.config`` flag (named like
TorchInductor's where it has one): ``freezing`` (parameters as constants, folded; batch norm folded
into the convolution before it), ``constant_folding`` (what reads no graph input computed once, at
compile time), ``shape_padding`` (matmul operands padded to aligned sizes), ``mm_bias_epilogue`` (a
bias that no generated kernel reads added by the matmul's library kernel)."""
