"""Edge-case probes of the synthetic and text data (CSBM, associative recall, MNIST-1D, character text) and the
test helpers (``testing.faults``, ``testing.graphs``), against independent references.

Probed: CSBM edge homophily, degree and feature signal estimated from many seeded graphs and compared with the
documented formulas within a few standard errors; homophily 0 and 1 at the smallest graphs; recall keys, values,
queries and targets rebuilt by hand (no answer in the inputs after its query); ``TextData.get_batch`` windows
(targets shifted by one, every start reachable, none past the end, seeded); unicode round trips; the fault helper
really interrupting; the graph helpers' sizes; numpy numbers, bools, NaN/inf and huge requests everywhere.

Found and fixed:
* ``csbm_graph`` drew the intra-class edge count from a float32 binomial: beyond ``2**24`` edges the count was
  rounded, so ``homophily=1.0`` gave inter-class edges (and a count rounded up asked for a negative number).
* ``csbm_graph(avg_degree=1e300)`` died with "cannot convert float NaN to integer".
* ``csbm_graph(mu=1e39)`` (finite) returned inf features without a word.
* ``edge_homophily`` read a ``(E,)`` or ``(3, E)`` edge_index, negative ids (wrapped) and a 2-D ``y`` silently.
* ``make_assoc_recall`` held an ``(N, V // 2)`` float tensor and its int64 argsort for the keys (8 GB for 10**4
  examples of a 131072 vocabulary); a vocabulary of 10**13 was a 40 TB allocation error.
* ``char_text_data(train_fraction="0.5")`` and ``load_mnist1d(val_fraction="0.1")``: bare comparison TypeErrors;
  ``load_mnist1d(num_samples=10**13)`` ran until memory ran out.
* ``interrupt_on_call`` refused a numpy-int ``call``, read ``after="no"`` as True and gave no "did you mean".
* ``assert_same_checkpoint_weights`` crashed on a module's extra state (plain Python values, which checkpoints
  allow) with "'dict' object has no attribute 'dtype'".
* ``complete_edge_index(self_loops="no")`` added self-loops; ``random_qkv`` refused a numpy seed ("an integer is
  required") and gave torch's argument dumps for float or bool sizes and an integer dtype.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from diffusionformer.data import IGNORE_INDEX, TextData, csbm_graph, edge_homophily, make_assoc_recall
from diffusionformer.data import csbm as csbm_module
from diffusionformer.data.text import char_text_data
from diffusionformer.testing import (assert_same_checkpoint_weights, causal_edge_index, complete_edge_index,
                                     cpu_allocations, interrupt_on_call, random_qkv)


def _gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


# --------------------------------------------------------------------------------------------- CSBM references


def test_csbm_homophily_degree_and_features_match_the_documented_model():
    """Pooled over 12 seeded graphs: edge homophily ~ Binomial(M, h) / M (z-score of the mean within 4 standard
    errors), exactly ``M = round(N d / 2)`` edges, every class's mean degree near ``d``, class means ``mu`` apart
    and unit-variance, uncorrelated noise."""
    N, C, d, h, D, mu = 1500, 3, 6.0, 0.35, 5, 2.5
    zs, dists, noise = [], [], []
    for seed in range(12):
        x, ei, y = csbm_graph(N, C, d, h, D, mu, _gen(seed))
        M = round(N * d / 2)
        assert ei.shape == (2, 2 * M) and y.bincount().tolist() == [500, 500, 500]
        zs.append((edge_homophily(ei, y) - h) / math.sqrt(h * (1 - h) / M))
        deg = torch.bincount(ei[0], minlength=N).double()
        assert float(deg.mean()) == 2 * M / N
        for c in range(C):  # per-class mean degree: 500 nodes, Poisson-like std ~ sqrt(d / 500) ~ 0.11
            assert abs(float(deg[y == c].mean()) - d) < 0.6
        means = torch.stack([x[y == c].double().mean(0) for c in range(C)])
        dists += [float((means[a] - means[b]).norm()) for a in range(C) for b in range(a + 1, C)]
        noise.append(x.double() - means[y])
    z_mean = sum(zs) / len(zs)
    assert abs(z_mean) < 4 / math.sqrt(len(zs)), zs
    # each distance estimate has std about sqrt(2 / 500) per coordinate: the mean of 36 within 0.1 of mu
    assert abs(sum(dists) / len(dists) - mu) < 0.1
    cov = torch.cov(torch.cat(noise).T)  # 18000 samples: entries within ~0.03 of I
    assert torch.allclose(cov, torch.eye(D, dtype=torch.float64), atol=0.05)


@pytest.mark.parametrize("h", [0.0, 1.0])
def test_csbm_extreme_homophily_on_the_smallest_graph(h):
    x, ei, y = csbm_graph(4, 2, 1.0, h, 2, 0.0, _gen(3))
    assert ei.shape == (2, 4) and edge_homophily(ei, y) == h
    assert not bool((ei[0] == ei[1]).any())


def test_bug_csbm_homophily_one_is_exact_beyond_float32_edge_counts(monkeypatch):
    """Bug: the intra-class edge count was drawn by ``torch.binomial`` on a float32 count, exact only up to
    ``2**24``: with ``M = 2**24 + 1`` edges and ``homophily=1.0`` it asked for ``2**24`` intra-class edges and one
    inter-class edge (seen on the full 21 s graph). The edge sampler is stubbed here to record the counts."""
    asked: list[int] = []

    def record(m, draw, N, g):
        asked.append(m)
        return torch.empty(0, dtype=torch.long)

    monkeypatch.setattr(csbm_module, "_sample_unique_pairs", record)
    N, M = 12000, 2**24 + 1
    csbm_graph(N, 2, 2 * M / N, 1.0, 2, 0.0, _gen())
    assert asked == [M, 0]
    asked.clear()
    csbm_graph(N, 2, 2 * M / N, 0.0, 2, 0.0, _gen())
    assert asked == [0, M]


def test_bug_csbm_avg_degree_beyond_the_pairs_is_named():
    """Bug: ``avg_degree=1e300`` died with "cannot convert float NaN to integer" (the binomial of a count beyond
    float32); any degree above ``N - 1`` is now refused before drawing, naming the bound."""
    with pytest.raises(ValueError, match=r"avg_degree=1e\+300 asks for more distinct edges than the 190 pairs of "
                                         r"20 nodes; avg_degree must be at most num_nodes - 1 = 19"):
        csbm_graph(20, 2, 1e300, 0.5, 4, 1.0, _gen())
    with pytest.raises(ValueError, match="at most num_nodes - 1 = 19"):
        csbm_graph(20, 2, 19.5, 0.5, 4, 1.0, _gen())
    with pytest.raises(ValueError, match="distinct pairs exist"):  # N - 1 passes the new check; the split may not fit
        csbm_graph(8, 2, 7.0, 1.0, 2, 1.0, _gen())


def test_bug_csbm_mu_beyond_float32_is_refused():
    """Bug: a finite ``mu`` beyond float32's range (``1e39``) returned inf features silently."""
    with pytest.raises(ValueError, match=r"mu=1e\+39 puts the features beyond float32's range"):
        csbm_graph(8, 2, 2.0, 0.5, 2, 1e39, _gen())
    x, _, _ = csbm_graph(8, 2, 2.0, 0.5, 2, 1e30, _gen())
    assert bool(torch.isfinite(x).all())


def test_bug_edge_homophily_checks_its_inputs():
    """Bug: ``edge_homophily`` took a 1-D edge_index (its one row as both ends: homophily 1.0 or garbage), a
    ``(3, E)`` one, negative ids (wrapped to the last nodes) and a 2-D ``y`` without a word; float edges gave
    torch's "tensors used as indices must be long"."""
    y = torch.tensor([0, 1, 1])
    for edges, match in [
        (torch.tensor([0, 1]), r"edge_index must have shape \(2, E\), got \(2,\)"),
        (torch.tensor([[0, 1], [1, 2], [0, 0]]), r"shape \(2, E\), got \(3, 2\)"),
        (torch.tensor([[0, -1], [1, 0]]), r"values must lie in \[0, 3\) \(the nodes of y\), got range \[-1, 1\]"),
        (torch.tensor([[0, 3], [1, 0]]), r"got range \[0, 3\]"),
    ]:
        with pytest.raises(ValueError, match=match):
            edge_homophily(edges, y)
    with pytest.raises(TypeError, match="edge_index must hold integer node ids, got dtype torch.float32"):
        edge_homophily(torch.tensor([[0.0, 1.0], [1.0, 0.0]]), y)
    with pytest.raises(TypeError, match="edge_index must be a tensor, got list"):
        edge_homophily([[0, 1], [1, 0]], y)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"y must be 1-D \(one label per node\), got shape \(3, 1\)"):
        edge_homophily(torch.tensor([[0, 1], [1, 2]]), y[:, None])
    assert edge_homophily(torch.tensor([[0, 1, 2], [1, 2, 1]], dtype=torch.int32), y) == 2 / 3
    with pytest.raises(ValueError, match="without edges"):
        edge_homophily(torch.zeros(2, 0, dtype=torch.long), y)


# ------------------------------------------------------------------------------------------ associative recall


@pytest.mark.parametrize("P, Q, V", [(1, 1, 4), (2, 2, 5), (5, 3, 11)])
def test_recall_matches_a_hand_built_reference(P, Q, V):
    """Keys distinct in ``[0, V // 2)``, values in ``[V // 2, V)``, queries distinct keys of the sequence, each
    target the value paired with its query, nothing supervised before the queries, and no answer among the inputs
    from the first query on (the model must look it up)."""
    x, y = make_assoc_recall(400, P, V, _gen(P + Q), num_queries=Q)
    assert x.shape == y.shape == (400, 2 * P + Q)
    for inputs, targets in zip(x.tolist(), y.tolist()):
        keys, values, queries = inputs[0 : 2 * P : 2], inputs[1 : 2 * P : 2], inputs[2 * P :]
        assert len(set(keys)) == P and all(0 <= k < V // 2 for k in keys)
        assert all(V // 2 <= v < V for v in values)
        assert len(set(queries)) == Q and set(queries) <= set(keys)
        lookup = dict(zip(keys, values))
        assert targets == [IGNORE_INDEX] * (2 * P) + [lookup[q] for q in queries]
        assert not set(queries) & set(values)  # keys and values never share a token


def test_recall_numpy_sizes_draw_what_python_ints_draw():
    a = make_assoc_recall(np.int64(30), np.int32(3), np.int16(12), _gen(5), num_queries=np.uint8(2))
    b = make_assoc_recall(30, 3, 12, _gen(5), num_queries=2)
    assert all(torch.equal(u, v) for u, v in zip(a, b))


def test_bug_recall_keys_are_drawn_without_the_full_random_matrix():
    """Bug: the distinct keys came from ``rand(N, V // 2).argsort(1)``: memory ``12 N V / 2`` bytes (8 GB for
    ``N = 10**4``, ``V = 131072``; 196 MB here), and ``vocab_size=10**13`` a 40 TB allocation error. The rows are
    now made a block at a time (the same numbers from the same generator) and the key range is capped."""
    N, P, V = 2000, 4, 2**14
    (x, y), changes, totals = cpu_allocations(lambda: make_assoc_recall(N, P, V, _gen(7)))
    peak = max(totals) - (totals[0] - changes[0])
    assert peak < 40 * 2**20, f"peak {peak / 2**20:.0f} MiB"
    g = _gen(7)  # the draws of the one-matrix version
    keys = torch.rand(N, V // 2, generator=g).argsort(dim=1)[:, :P]
    assert torch.equal(x[:, 0 : 2 * P : 2], keys)
    with pytest.raises(ValueError, match=r"vocab_size must be at most 33554433 .* got 10000000000000"):
        make_assoc_recall(2, 2, 10**13, _gen())


# ------------------------------------------------------------------------------------------------------- text


def test_get_batch_windows_reach_every_start_and_never_cross_the_end():
    text = "abcdefghijklmnopqrstuvwxyz"
    data = char_text_data("toy", text, train_fraction=0.5)  # train "a..m" (13), val "n..z" (13)
    assert set(data.decode(data.train)).isdisjoint(data.decode(data.val))  # no overlap of train and val text
    T, L = 4, 13
    x, y = data.get_batch("train", 5000, T, _gen(1))
    starts = x[:, 0]
    assert sorted(starts.unique().tolist()) == list(range(L - T))  # every start 0..L-T-1 reached
    assert bool((x[:, 1:] == y[:, :-1]).all()) and bool((y == x + 1).all())  # shifted by one, contiguous
    assert int(y.max()) == L - 1  # the last train token is a target, nothing beyond it
    again = data.get_batch("train", 5000, T, _gen(1))
    assert torch.equal(again[0], x) and torch.equal(again[1], y)


def test_unicode_text_round_trips_and_unknown_characters_are_named():
    text = "naïve café — 日本語 😀 e\u0301\n\t\r"
    data = char_text_data("uni", text * 3)
    assert data.decode(torch.cat([data.train, data.val])) == text * 3
    assert data.decode(data.encode("")) == "" and data.encode("").dtype == torch.int64
    with pytest.raises(ValueError, match=r"character 'z' is not in the 'uni' vocabulary"):
        data.encode("caz")
    assert isinstance(data, TextData) and data.vocab_size == len(set(text))


def test_bug_char_text_data_names_a_string_train_fraction():
    """Bug: ``char_text_data(train_fraction="0.5")`` died with "'<' not supported between instances of 'float' and
    'str'"; numpy floats still split as the Python float they equal."""
    with pytest.raises(ValueError, match=r"train_fraction must be in \(0, 1\) \(a number\), got '0.5'"):
        char_text_data("t", "abcdef", train_fraction="0.5")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"train_fraction must be in \(0, 1\) \(a number\), got True"):
        char_text_data("t", "abcdef", train_fraction=True)
    got = char_text_data("t", "abcdef", train_fraction=np.float32(0.5))
    assert got.train.tolist() == [0, 1, 2] and got.val.tolist() == [3, 4, 5]


def test_bug_mnist1d_refuses_a_huge_count_and_a_string_fraction(monkeypatch):
    """Bug: ``load_mnist1d(num_samples=10**13)`` ran the package's one-at-a-time generator until memory ran out,
    and ``val_fraction="0.1"`` died with "'<=' not supported between instances of 'float' and 'str'"."""
    mdata = pytest.importorskip("mnist1d.data")
    from diffusionformer.data.sequences import load_mnist1d

    def never(args):  # the huge request must be refused before the generator runs (it would run for days)
        raise AssertionError(f"make_dataset called for {args.num_samples} samples")

    with monkeypatch.context() as patch:
        patch.setattr(mdata, "make_dataset", never)
        with pytest.raises(ValueError, match=r"num_samples must be at most 10,000,000 .* got 10,000,000,000,000"):
            load_mnist1d(num_samples=10**13)
    with pytest.raises(ValueError, match=r"val_fraction must be in \[0, 1\) \(a number\), got '0.1'"):
        load_mnist1d(num_samples=20, val_fraction="0.1")  # type: ignore[arg-type]
    data = load_mnist1d(num_samples=29)  # rounded down to ten per class, as documented
    assert sum(data.meta["sizes"].values()) == 20


# --------------------------------------------------------------------------------------------- test helpers


def test_interrupt_on_call_really_interrupts_the_chosen_call_only():
    class Counter:
        def __init__(self):
            self.n = 0

        def step(self):
            self.n += 1
            return self.n

    c = Counter()
    with interrupt_on_call(Counter, "step", 3, after=True) as seen:
        assert [c.step(), c.step()] == [1, 2]
        with pytest.raises(KeyboardInterrupt, match=r"simulated kill in step \(call 3\)"):
            c.step()
        assert c.n == 3 and seen["calls"] == 3  # after=True: the third call ran before the kill
        assert c.step() == 4  # later calls go through
    assert "step" in Counter.__dict__ and c.step() == 5


def test_bug_interrupt_on_call_reads_numpy_calls_and_checks_its_flag_and_name():
    """Bug: ``interrupt_on_call(..., np.int64(2))`` was refused ("call must be an int, got int64") where the package
    reads numpy ints; ``after="no"`` read as True; a misspelt method gave a bare AttributeError."""

    class Task:
        def loss(self):
            return 0

    with interrupt_on_call(Task, "loss", np.int64(2)) as seen:
        Task().loss()
        with pytest.raises(KeyboardInterrupt):
            Task().loss()
    assert seen["calls"] == 2
    with pytest.raises(TypeError, match=r"after must be a bool, got str \('no'\)"):
        with interrupt_on_call(Task, "loss", 1, after="no"):  # type: ignore[arg-type]
            pass
    with pytest.raises(TypeError, match=r"after must be a bool, got numpy.bool"):
        with interrupt_on_call(Task, "loss", 1, after=np.bool_(True)):  # type: ignore[arg-type]
            pass
    with pytest.raises(AttributeError, match=r"has no attribute 'los' \(did you mean 'loss'\?\)"):
        with interrupt_on_call(Task, "los", 1):
            pass
    assert Task.__dict__["loss"](Task()) == 0  # untouched


def test_bug_checkpoint_weights_compare_a_modules_extra_state(tmp_path):
    """Bug: a module's ``get_extra_state`` (plain Python values, allowed in checkpoints) put a dict in the state
    dict, and ``assert_same_checkpoint_weights`` died with "'dict' object has no attribute 'dtype'"."""

    class WithExtra(torch.nn.Module):
        def __init__(self, step):
            super().__init__()
            self.lin = torch.nn.Linear(2, 2)
            self.step = step

        def get_extra_state(self):
            return {"step": self.step, "decay": float("nan"), "t": torch.tensor([1.0])}

        def set_extra_state(self, state):
            self.step = state["step"]

    torch.manual_seed(0)
    model = WithExtra(3)
    for name, step in (("a", 3), ("b", 3), ("c", 4)):
        model.step = step
        torch.save({"model": model.state_dict()}, tmp_path / f"{name}.pt")
    assert_same_checkpoint_weights(tmp_path / "a.pt", tmp_path / "b.pt")  # NaN equals itself
    with pytest.raises(AssertionError, match=r"1 of 3 tensors differ .*_extra_state"):
        assert_same_checkpoint_weights(tmp_path / "a.pt", tmp_path / "c.pt")


def test_graph_helpers_give_the_documented_sizes():
    for n in (0, 1, 2, 5):
        full, no_loops, causal = complete_edge_index(n), complete_edge_index(n, self_loops=False), causal_edge_index(n)
        assert full.shape == (2, n * n) and no_loops.shape == (2, n * (n - 1)) and causal.shape == (2, n * (n + 1) // 2)
        assert not bool((no_loops[0] == no_loops[1]).any()) and bool((causal[0] <= causal[1]).all())
        assert {tuple(e) for e in full.T.tolist()} == {(j, i) for j in range(n) for i in range(n)}


def test_bug_graph_helpers_check_flags_sizes_seeds_and_dtypes():
    """Bug: ``complete_edge_index(self_loops="no")`` kept the self-loops; ``random_qkv(seed=np.int64(3))`` died in
    ``manual_seed`` ("an integer is required"), a float or bool size gave torch's argument dump, an integer dtype
    "normal_kernel_cpu not implemented for 'Long'"."""
    with pytest.raises(TypeError, match=r"self_loops must be a bool, got str \('no'\)"):
        complete_edge_index(2, self_loops="no")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="self_loops must be a bool, got numpy.bool"):
        complete_edge_index(2, self_loops=np.bool_(False))  # type: ignore[arg-type]
    numpy_seed, int_seed = random_qkv(1, 2, 3, 4, seed=np.int64(3)), random_qkv(1, 2, 3, 4, seed=3)
    assert all(torch.equal(a, b) for a, b in zip(numpy_seed, int_seed))
    assert random_qkv(1, 1, 0, 2)[0].shape == (1, 1, 0, 2) and random_qkv(1, 1, 1, 1, seed=-1)[0].dtype == torch.float64
    with pytest.raises(TypeError, match=r"N must be an int, got float \(3.0\)"):
        random_qkv(1, 2, 3.0, 4)  # type: ignore[arg-type]
    with pytest.raises(TypeError, match=r"B must be an int, got bool \(True\)"):
        random_qkv(True, 2, 3, 4)
    with pytest.raises(ValueError, match="C must be >= 0, got -4"):
        random_qkv(1, 2, 3, -4)
    with pytest.raises(TypeError, match="dtype must be a floating or complex torch.dtype .* got torch.int64"):
        random_qkv(dtype=torch.int64)
