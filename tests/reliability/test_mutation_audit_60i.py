"""Mutation audit 60i: csbm, associative recall, the uniform map and the attention / Laplacian operators.

Each test kills mutants that the existing tests let through, against an expectation worked out by hand (the CSBM
definition, the operators' polynomials, the loaders' documented contract), never against the code itself. The
recall and uniform-map mutants were all killed by the existing tests or are equivalent.
"""

from __future__ import annotations

import pytest
import torch

from diffusionformer.data import csbm_graph, load_dataset
from diffusionformer.operators import AttentionOperator, LaplacianOperator


def test_csbm_every_node_is_an_equally_likely_edge_end():
    # balanced classes: every intra-class pair (h = 1) and every inter-class pair (h = 0) is equally likely, so each
    # node's expected degree is d, whatever its id or its rank among the ids of its class. N = 40, C = 2, d = 8: a
    # degree's variance is below d (1 - d / 20) = 4.8 (hypergeometric: M edges drawn without replacement), so a
    # node's mean degree over 60 graphs has std <= 0.29 (a rank's, over 60 graphs x 2 classes, <= 0.2); 1.5 is over
    # 5 sigma. A draw that missed the last node of a class, or the last node id as the first end, gave it about d / 2.
    N, C, d, seeds = 40, 2, 8.0, 60
    for h in (0.0, 1.0):
        by_node = torch.zeros(N, dtype=torch.float64)
        by_rank = torch.zeros(N // C, dtype=torch.float64)
        for seed in range(seeds):
            _, edge_index, y = csbm_graph(N, C, d, h, C, 0.0, torch.Generator().manual_seed(seed))
            degree = torch.bincount(edge_index[0], minlength=N).double()
            by_node += degree
            for c in range(C):
                by_rank += degree[(y == c).nonzero().flatten()]  # nodes of class c by increasing id
        for mean in (by_node / seeds, by_rank / (seeds * C)):
            assert float((mean - d).abs().max()) < 1.5, (h, mean.tolist())


def test_fixed_operators_static_coefficients_are_their_definition_on_any_device_and_dtype():
    # f(P) = P is (c0, c1) = (0, 1) and f(P) = I - P is (1, -1), as Python floats, whatever the buffer's device or
    # dtype: a model built under torch.device("meta") (deferred init) plans its fused path from them, and a value
    # read back from the buffer (a meta tensor holds none) raised there
    for cls, expected in ((AttentionOperator, (0.0, 1.0)), (LaplacianOperator, (1.0, -1.0))):
        with torch.device("meta"):
            op = cls(2)
        for module in (op, cls(2).to(torch.bfloat16), cls(2).double()):
            got = module.static_coefficients()
            assert got == expected and all(type(c) is float for c in got), (cls.name, got)


def test_load_csbm_of_a_graph_rounded_to_no_edges_has_no_measured_homophily():
    # avg_degree = 0.1 on 10 nodes asks for round(10 * 0.1 / 2) = 0 edges: a valid, empty graph whose edge homophily
    # is undefined (0 / 0), so the meta records None instead of raising
    data = load_dataset("csbm", num_nodes=10, avg_degree=0.1, feature_dim=4, seed=0)
    assert data.data.edge_index.shape == (2, 0) and data.data.x.shape == (10, 4)
    assert data.meta["measured_edge_homophily"] is None


@pytest.mark.parametrize("option, part", [("val_fraction", "val"), ("test_fraction", "test")])
def test_load_csbm_refuses_fractions_that_leave_a_held_out_part_empty(option, part):
    # 0.02 of 20 nodes (0.4) rounds to no node: the run would only fail at its first evaluation
    with pytest.raises(ValueError, match=rf"csbm: {option}=0.02 leaves the {part} split empty"):
        load_dataset("csbm", num_nodes=20, avg_degree=2.0, **{option: 0.02})
