"""Edge probes of edge features in the graph transformer (GraphBlock / DiffusionGraphTransformer with edge_dim)."""

import warnings

import pytest
import torch

from diffusionformer.models.graph_transformer import DiffusionGraphTransformer, GraphBlock, GraphTransformerConfig

_EI = torch.tensor([[0, 1, 2, 3, 1, 0], [1, 2, 3, 0, 1, 1]])  # a given self loop (1 -> 1) and a duplicate (0 -> 1)


def _model(**kw):
    torch.manual_seed(0)
    cfg = GraphTransformerConfig(**{"in_channels": 3, "num_classes": 2, "dim": 8, "num_heads": 2, "edge_dim": 2,
                                    "depth": 1, "heads": "attention:1,heat(steps=2):1", **kw})
    return DiffusionGraphTransformer(cfg).double().eval()


@pytest.mark.parametrize("dtype", [torch.uint16, torch.uint32, torch.uint64])
@pytest.mark.parametrize("self_loops", [True, False])
def test_bug_unsigned_edge_index_with_edge_attr_equals_int64(dtype: torch.dtype, self_loops: bool) -> None:
    """Bug: an edge_index of dtype uint16/uint32/uint64 (taken as integers by the graphs, and by the model without
    edge features) failed with edge features and self loops in PyG's add_self_loops: "Promotion for uint16, uint32,
    uint64 types is not supported", the edge features never read."""
    m = _model(self_loops=self_loops)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(5, 3, dtype=torch.float64, generator=g)  # node 4 isolated
    ea = torch.randn(_EI.shape[1], 2, dtype=torch.float64, generator=g)
    ref = m(x, _EI, edge_attr=ea)
    torch.testing.assert_close(m(x, _EI.to(dtype), edge_attr=ea), ref, rtol=0, atol=0)


def test_bug_graph_block_refuses_complex_edge_attr() -> None:
    """Bug: GraphBlock(edge_dim=...) cast a complex edge_attr to its float dtype, dropping the imaginary part with only
    a ComplexWarning (the model refuses it, the block it is built from took it)."""
    block = GraphBlock(8, 2, edge_dim=2).eval()
    x = torch.randn(4, 8)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the cast's ComplexWarning must not be how the caller learns of it
        with pytest.raises(TypeError, match="edge_attr must hold real values"):
            block(x, _EI, edge_attr=torch.randn(6, 2, dtype=torch.complex64))
    assert block(x, _EI, edge_attr=torch.randn(6, 2)).shape == (4, 8)


def test_bug_graph_block_names_edge_attr_on_another_device() -> None:
    """Bug: GraphBlock(edge_dim=...) given edge_attr on another device than x projected it first and then failed
    with "edge_keys must be on the device of x" (an argument the caller never passed; on a GPU, a bare matmul
    device error), instead of naming edge_attr."""
    block = GraphBlock(8, 2, edge_dim=2).eval()
    with pytest.raises(ValueError, match="edge_attr must be on x's device"):
        block(torch.randn(4, 8), _EI, edge_attr=torch.randn(6, 2, device="meta"))


@pytest.mark.parametrize("edge_dim, error", [(True, TypeError), (2.0, TypeError), ("2", TypeError), (0, ValueError),
                                             (-1, ValueError)])
def test_bug_graph_block_checks_edge_dim(edge_dim, error) -> None:
    """Bug: GraphBlock (public) took edge_dim unchecked, where GraphTransformerConfig refuses all but a positive int:
    True built a 1-wide edge projection (edge_attr (E, 1) then passed as "edge_dim=True" features), 0 a block whose
    edge features were (E, 0) and changed nothing, and -1, 2.0 or "2" failed inside nn.Linear with torch's
    'negative dimension' or 'empty(): argument size' errors that never named edge_dim."""
    import numpy as np

    with pytest.raises(error, match="GraphBlock.edge_dim must be a positive int"):
        GraphBlock(8, 2, edge_dim=edge_dim)
    block = GraphBlock(8, 2, edge_dim=np.int64(2))  # a sweep's numpy int is still an int
    assert block.edge_proj.in_features == 2 and type(block.edge_proj.in_features) is int


@pytest.mark.parametrize("N", [3, 7, 120])  # zero-padded (N <= k), PyG's dense eigh, PyG's sparse eigsh (N >= 100)
def test_bug_laplacian_pe_is_a_function_of_the_graph(N: int) -> None:
    """Bug: the Laplacian PE flipped the sign of every eigenvector at random (PyG's transform does), drawing from the
    global generator: the same graph got another PE at every call, so with the transform applied on the fly (as the
    dataset's transform) an eval-mode model gave other logits from one epoch to the next, and pe_sign_flip=False
    (documented as the switch of the random flip in training) could not turn random signs off."""
    from torch_geometric.data import Data
    from torch_geometric.utils import get_laplacian, to_dense_adj, to_undirected

    from diffusionformer.models.graph_transformer import positional_encoding_transform

    k = 4
    t = positional_encoding_transform(GraphTransformerConfig(in_channels=1, pe="laplacian", pe_dim=k))
    ring = torch.stack([torch.arange(N), (torch.arange(N) + 1) % N])
    ei = to_undirected(torch.cat([ring, torch.tensor([[0], [N // 2]])], 1), num_nodes=N)  # a ring and a chord
    pes = []
    for seed in range(6):
        torch.manual_seed(seed)
        pes.append(t(Data(edge_index=ei, num_nodes=N)).pe)
        state = torch.get_rng_state()
        torch.manual_seed(seed)
        assert torch.equal(torch.get_rng_state(), state)  # the transform draws no random number
    for pe in pes[1:]:
        assert torch.equal(pe, pes[0])
    # still eigenvectors of the normalised Laplacian (float64 reference), of its smallest non-trivial eigenvalues
    li, lw = get_laplacian(ei, normalization="sym", num_nodes=N)
    L = to_dense_adj(li, edge_attr=lw, max_num_nodes=N)[0].double()
    pe = pes[0].double()[:, :min(k, N - 1)]
    lam = (pe * (L @ pe)).sum(0)
    torch.testing.assert_close(L @ pe, pe * lam, rtol=0, atol=1e-5)
    torch.testing.assert_close(lam, torch.linalg.eigvalsh(L)[1:1 + pe.shape[1]], rtol=0, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.int16, torch.uint8, torch.bool])
def test_bug_graph_models_name_the_batch_dtypes_they_take(dtype):
    """Bug: a graph model refused an int16 or uint8 ``batch`` with "batch must hold integer graph ids, got dtype
    torch.int16", which it does; the message now names the dtypes taken and the conversion."""
    from diffusionformer.models.common import _check_batch

    with pytest.raises(TypeError, match=r"of dtype torch.int64 or torch.int32, got dtype " + str(dtype)
                       + r" \(as int64: batch.long\(\)\)"):
        _check_batch(torch.zeros(3, dtype=dtype), 3)
    with pytest.raises(TypeError, match=r"got dtype torch.float32 \(the third positional argument is batch") as err:
        _check_batch(torch.zeros(3), 3)  # no advice to convert: edge weights, most likely (sitting 52)
    assert "batch.long" not in str(err.value)
    _check_batch(torch.zeros(3, dtype=torch.int32), 3)


def test_bug_uint64_edge_ids_past_int64_are_named_as_given():
    """Bug: a uint64 ``edge_index`` holding an id of 2**63 or more wrapped to a negative int64 in the conversion,
    and the bounds error read "got range [-9223372036854775807, 1]", an id the caller never gave."""
    from diffusionformer.graph import AttentionGraph

    edges = torch.tensor([[2**63 + 1, 0], [0, 1]], dtype=torch.uint64)
    with pytest.raises(ValueError, match=r"uint64 ids of 2\*\*63 or more \(past int64\), up to 9223372036854775809"):
        AttentionGraph.sparse(edges, 2)
    g = AttentionGraph.sparse(torch.tensor([[1, 0], [0, 1]], dtype=torch.uint64), 2)  # in range: taken as int64
    assert g.edge_index.dtype == torch.int64 and g.edge_index.tolist() == [[1, 0], [0, 1]]
