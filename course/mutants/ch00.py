"""Wrong answers to chapter 0 (the measuring instruments)."""
from course.mutants import Mutant

MUTANTS = [
    Mutant("0.1", "counts by the op's short name", "self.counts[str(func)] += 1", "self.counts[func.__name__] += 1"),
    Mutant("0.1", "counts the overload packet, not the overload", "self.counts[str(func)] += 1",
           "self.counts[str(func.overloadpacket)] += 1"),
    Mutant("0.1", "runs the op but drops its result", "        return func(*args, **kwargs)", "        func(*args, **kwargs)"),
    Mutant("0.2", "counts the returned tensors' storage too", "skip = {_storage_key(t) for t in inputs + returned}",
           "skip = {_storage_key(t) for t in inputs}"),
    Mutant("0.2", "counts a storage every time an op returns it (views, in-place ops)",
           "if key in skip or key in seen:", "if key in skip:"),
    Mutant("0.2", "identifies memory by tensor object, not storage", "        key = _storage_key(t)\n", "        key = id(t)\n"),
    Mutant("0.3", "no synchronize before the timed clock reads",
           "    for _ in range(repeat):\n        sync()\n        start = clock()", "    for _ in range(repeat):\n        start = clock()"),
    Mutant("0.3", "the first call's time read before its work is finished", "    fn(*args)\n    sync()\n    first = clock() - start",
           "    fn(*args)\n    first = clock() - start"),
    Mutant("0.3", "the mean instead of the median", "median_s=statistics.median(times)", "median_s=statistics.mean(times)"),
    Mutant("0.3", "one warmup call too few", "for _ in range(warmup):", "for _ in range(warmup - 1):"),
    Mutant("0.4", "does not record the example inputs", "        self.example_inputs.append(list(example_inputs))\n", ""),
    Mutant("0.4", "records only the first graph", "        self.graphs.append(gm)\n",
           "        if not self.graphs:\n            self.graphs.append(gm)\n"),
    Mutant("0.4", "returns nothing to run", "        return gm.forward", "        return None"),
]
