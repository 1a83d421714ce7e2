"""Einsum (torch.einsum; ONNX Einsum, written at import as Transpose,
Reshape, MatMul and ReduceSum by aidge_interop/onnx/einsum.py): wrapped modules
against torch (outputs, input and parameter gradients), and the equations
the engine refuses, named."""
import copy

import pytest
import torch
from onnx import TensorProto, helper

import aidge_interop
from op_harness import check_wrapped_step


class Einsum(torch.nn.Module):
    """torch.einsum(equation, *inputs, *parameters)."""

    def __init__(self, equation, param_shapes):
        super().__init__()
        self.equation = equation
        self.params = torch.nn.ParameterList(
            [torch.nn.Parameter(torch.randn(s)) for s in param_shapes])

    def forward(self, *xs):
        return torch.einsum(self.equation, *xs, *self.params)


# equation, input shapes, parameter shapes
CASES = [
    ("bij,jk->bik", [(2, 3, 4)], [(4, 5)]),
    ("ij,jk", [(3, 4)], [(4, 5)]),  # implicit output
    ("ij->ji", [(3, 4)], []),
    ("bij->b", [(2, 3, 4)], []),
    ("i,i->", [(5,)], [(5,)]),
    ("i,j->ij", [(3,)], [(4,)]),
    ("i,i->i", [(4,)], [(4,)]),
    ("bhqd,bhkd->bhqk", [(2, 3, 4, 5), (2, 3, 6, 5)], []),
    ("bij,bkj->bik", [(2, 3, 4), (2, 5, 4)], []),
    ("bi,bj->bij", [(2, 3), (2, 4)], []),
    ("...ij,...jk->...ik", [(2, 3, 4, 5)], [(5, 6)]),
    ("b...d,de->b...e", [(2, 3, 4, 5)], [(5, 6)]),
    ("ij,jk,kl->il", [(2, 3)], [(3, 4), (4, 5)]),
    ("bn,anm,bm->ba", [(2, 3)], [(4, 3, 5), (2, 5)]),
    ("abc,cd->abd", [(2, 3, 4)], [(4, 2)]),
    ("abcd->cadb", [(2, 3, 4, 5)], []),
]


@pytest.mark.parametrize("equation, shapes, param_shapes", CASES,
                         ids=[c[0] for c in CASES])
def test_einsum_matches_torch(equation, shapes, param_shapes):
    torch.manual_seed(0)
    model = Einsum(equation, param_shapes)
    wrapped = aidge_interop.wrap(copy.deepcopy(model), shapes)
    check_wrapped_step(model, wrapped, [torch.randn(s) for s in shapes])


def test_dynamic_batch():
    torch.manual_seed(1)
    model = Einsum("bqd,kd->bqk", [(6, 5)])
    wrapped = aidge_interop.wrap(copy.deepcopy(model), [(2, 3, 5)])
    for batch in (1, 7):
        x = torch.randn(batch, 3, 5)
        with torch.no_grad():
            torch.testing.assert_close(wrapped(x), model(x), rtol=1e-5, atol=1e-5)


def _einsum_model(equation, shapes):
    node = helper.make_node("Einsum", [f"x{i}" for i in range(len(shapes))], ["y"],
                            name="the_einsum", equation=equation)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info(f"x{i}", TensorProto.FLOAT, s)
                      for i, s in enumerate(shapes)],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 13)])


@pytest.mark.parametrize("equation, shapes, error, message", [
    ("ii->i", [(3, 3)], NotImplementedError, "diagonal"),
    ("ij,jk->ik", [(3, 4)], ValueError, "2 operand"),
    ("ij->ik", [(3, 4)], ValueError, "no operand has"),
    ("ijk->i", [(3, 4)], ValueError, "rank 2"),
    ("i+j->i", [(3,)], ValueError, "not an Einsum equation"),
])
def test_bad_or_unsupported_equations_are_refused_by_name(equation, shapes, error, message):
    with pytest.raises(error, match=rf"the_einsum.*{message}"):
        aidge_interop.load_onnx(_einsum_model(equation, shapes))
