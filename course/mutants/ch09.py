"""Wrong answers to chapter 9 (C++ code generation and the code cache)."""
from course.mutants import Mutant

MUTANTS = [
    Mutant("9.1", "relu that turns NaN into 0", '"relu": "({0} < 0 ? 0 : {0})"', '"relu": "({0} > 0 ? {0} : 0)"'),
    Mutant("9.1", "maximum that loses a NaN in the first operand", '"maximum": "(({0} != {0} || {0} > {1}) ? {0} : {1})"',
           '"maximum": "({0} > {1} ? {0} : {1})"'),
    Mutant("9.1", "where with the branches swapped", '"where": "({0} ? {1} : {2})"', '"where": "({0} ? {2} : {1})"'),
    Mutant("9.1", "sigmoid with exp(x)", '"sigmoid": "1 / (1 + std::exp(-{0}))"', '"sigmoid": "1 / (1 + std::exp({0}))"'),
    Mutant("9.2", "max starts from 0", 'init = f"-std::numeric_limits<{acc_type}>::infinity()" if floating else f"std::numeric_limits<{acc_type}>::lowest()"',
           'init = f"static_cast<{acc_type}>(0)"'),
    Mutant("9.2", "max with std::max (loses NaN)", '"{acc} = tiny_max({acc}, {value})"', '"{acc} = std::max({acc}, {value})"'),
    Mutant("9.2", "prod starts from 0", 'return f"static_cast<{acc_type}>(1)", "{acc} *= {value}", "*"',
           'return f"static_cast<{acc_type}>(0)", "{acc} *= {value}", "*"'),
    Mutant("9.2", "infinity as the identity for integers too", 'floating = acc_type in ("float", "double")', "floating = True"),
    Mutant("9.3", "rows and columns mixed up in the index", "acc += x[i * cols + j];", "acc += x[j * rows + i];"),
    Mutant("9.3", "no parallel loop over the rows", "    #pragma omp parallel for\n", ""),
    Mutant("9.3", "reads one element past the row", "for (int64_t j = 0; j < cols; ++j)", "for (int64_t j = 0; j <= cols; ++j)"),
    Mutant("9.4", "leaves the temporary file behind when writing fails",
           "    finally:\n        if os.path.exists(tmp):\n            os.unlink(tmp)", "    finally:\n        pass"),
    Mutant("9.4", "writes straight into the target", 'with os.fdopen(fd, "wb") as f:', 'with open(path, "wb") as f:'),
    Mutant("9.4", "never moves the temporary into place", "        os.replace(tmp, path)\n", ""),
    Mutant("9.5", "does not strip the checksum's whitespace", "expected = Path(checksum).read_text().strip()",
           "expected = Path(checksum).read_text()"),
    Mutant("9.5", "a missing file raises instead of returning False",
           "    except OSError:\n        return False", "    except ValueError:\n        return False"),
    Mutant("9.5", "MD5 instead of SHA-256", "hashlib.sha256(", "hashlib.md5("),
    Mutant("9.5", "prefix comparison", "return bool(expected) and actual == expected", "return actual.startswith(expected)"),
]
