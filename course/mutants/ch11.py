"""Wrong answers to chapter 11 (end to end)."""
from course.mutants import Mutant

MUTANTS = [
    Mutant("11.1", "counts an output every time it is listed, inputs returned too",
           "if isinstance(out, torch.Tensor) and id(out) not in seen:", "if isinstance(out, torch.Tensor):"),
    Mutant("11.1", "4 bytes per element whatever the dtype", "total += out.numel() * out.element_size()",
           "total += out.numel() * 4"),
    Mutant("11.1", "non-tensor inputs counted as tensors",
           "total = sum(t.numel() * t.element_size() for t in example_inputs if isinstance(t, torch.Tensor))",
           "total = sum(torch.as_tensor(t).numel() * torch.as_tensor(t).element_size() for t in example_inputs)"),
    Mutant("11.2", "branches swapped", "torch.where(y.sum() > 0, y * 2, y - 2)", "torch.where(y.sum() > 0, y - 2, y * 2)"),
    Mutant("11.2", "decides per element", "torch.where(y.sum() > 0, y * 2, y - 2)", "torch.where(y > 0, y * 2, y - 2)"),
    Mutant("11.2", "tests the sum of x instead of y", "torch.where(y.sum() > 0, y * 2, y - 2)",
           "torch.where(x.sum() > 0, y * 2, y - 2)"),
    Mutant("11.3", "a length equal to a bucket goes to the next one", "if size >= n:", "if size > n:"),
    Mutant("11.3", "past the largest bucket, the largest bucket", "return math.ceil(n / largest) * largest", "return largest"),
    Mutant("11.3", "buckets taken in the given order", "for size in sorted(buckets):", "for size in buckets:"),
    Mutant("11.3", "pads in front of the data", "x = torch.cat([x, x.new_zeros(pad_shape)], dim=dim)",
           "x = torch.cat([x.new_zeros(pad_shape), x], dim=dim)"),
    Mutant("11.3", "never pads: every length is its own shape", "target = bucket_length(n, buckets)", "target = n"),
    Mutant("11.3", "slices the last dim instead of dim", "return fn(x).narrow(dim, 0, n)", "return fn(x).narrow(-1, 0, n)"),
]
