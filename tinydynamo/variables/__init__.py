"""The VariableTracker family (one kind of traced value per module).

Layer (``tinydynamo.LAYERS``): the top of the values layer, re-exporting the common trackers. Python
runs this file before any module of the package, so importing the builder and objects here (and
through them every tracker module) registers every tracker that a lower module makes by name
(variables/base.py: ``constructor``) before any tracker is used.
"""
from tinydynamo.variables import builder, objects  # noqa: F401  (they register trackers by name)
from tinydynamo.variables.base import NULL, NullVariable, VariableTracker
from tinydynamo.variables.builtin import BuiltinVariable
from tinydynamo.variables.constant import ConstantVariable
from tinydynamo.variables.dicts import DictVariable
from tinydynamo.variables.functions import (
    CellVariable,
    NestedUserFunctionVariable,
    UserFunctionVariable,
    UserMethodVariable,
)
from tinydynamo.variables.lists import ListIteratorVariable, ListVariable, SizeVariable, TupleVariable
from tinydynamo.variables.misc import GetAttrVariable, PythonModuleVariable
from tinydynamo.variables.nn_module import NNModuleVariable
from tinydynamo.variables.tensor import TensorVariable
from tinydynamo.variables.torch import TorchVariable
from tinydynamo.variables.user_defined import UserDefinedObjectVariable

__all__ = [
    "NULL", "NullVariable", "VariableTracker", "BuiltinVariable", "ConstantVariable", "DictVariable",
    "CellVariable", "NestedUserFunctionVariable", "UserFunctionVariable", "UserMethodVariable",
    "ListIteratorVariable", "ListVariable", "SizeVariable", "TupleVariable", "GetAttrVariable",
    "PythonModuleVariable", "NNModuleVariable", "TensorVariable", "TorchVariable", "UserDefinedObjectVariable",
]
