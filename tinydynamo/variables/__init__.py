"""The VariableTracker family (one kind of traced value per module)."""
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
