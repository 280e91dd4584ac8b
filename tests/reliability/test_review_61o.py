"""Review 61o of 3f48f64 (a CSV's row of the log's torn last line), f36f491 + 3ce58fa (data fingerprints) and 61m's
knn normalisation: (1) a torn line too short to name its step (``{``, ``{"step": 1``) made a resume drop the row of
a damaged line before it from a table listed after the log, the only copy of that record; (2) ``_tensor_sha256``
failed on a complex128 tensor (``KeyError: 16``) and on a conjugate view."""
import json

import pytest
import torch


def _record(step, split="train"):
    return {"step": step, "split": split, "loss": 1.0 / step, "lr": 0.1, "metrics": {"acc": step / 8},
            "elapsed": float(step), "time": 100.0 + step}


# ---- (1) a short torn line: the table's last row is a damaged line's only copy, not the torn record's -------------

@pytest.mark.parametrize("cut", [1, 9, 10])  # b'{', b'{"step": ', b'{"step": 1'
def test_bug_a_short_torn_line_drops_no_row_of_a_damaged_line_before_it(tmp_path, cut):
    """Bug: written through ``["jsonl", "csv"]`` (the table after the log), step 10's log line damaged in place and
    the run killed while the log wrote step 11's line (so the table never got step 11's row); the torn line cut
    before its step's last digit matched step 10's row, which the resume dropped: step 10's only copy, lost."""
    from diffusionformer.train import read_metrics_csv
    from diffusionformer.train.loggers import open_loggers

    log = open_loggers(["jsonl", "csv"], tmp_path)
    for s in range(1, 11):
        log.append(_record(s))
    log.close()
    path = tmp_path / "metrics.jsonl"
    lines = path.read_bytes().splitlines(keepends=True)
    torn = json.dumps(_record(11)).encode()[:cut]
    path.write_bytes(b"".join(lines[:-1]) + lines[-1][:12] + b"\n" + torn)  # 10 damaged, 11 torn
    log = open_loggers(["jsonl", "csv"], tmp_path)
    with pytest.warns(UserWarning, match="malformed"):
        log.truncate(11)
    log.close()
    assert [r["step"] for r in read_metrics_csv(tmp_path)] == list(range(1, 11))


@pytest.mark.parametrize("cut", [1, 9, 10])
def test_a_short_torn_line_still_drops_the_row_of_a_table_listed_before_the_log(tmp_path, cut):
    """The other side: a table listed before the log holds the torn record's whole row, its last, after the row of
    the log's last whole line; that row goes, however short the torn line."""
    from diffusionformer.train import read_metrics, read_metrics_csv
    from diffusionformer.train.loggers import CSVLog, open_loggers

    log = open_loggers(["csv", "jsonl"], tmp_path)
    for s in range(1, 11):
        log.append(_record(s))
    log.close()
    CSVLog(tmp_path / "metrics.csv").append(_record(11))
    with open(tmp_path / "metrics.jsonl", "ab") as f:
        f.write(json.dumps(_record(11)).encode()[:cut])
    for resumed in (["jsonl", "csv"], ["csv", "jsonl"]):
        log = open_loggers(resumed, tmp_path)
        log.truncate(11)
        log.close()
        assert [r["step"] for r in read_metrics_csv(tmp_path)] == [r["step"] for r in read_metrics(tmp_path)]
        assert [r["step"] for r in read_metrics(tmp_path)] == list(range(1, 11))


_ORDERS = (("jsonl", "csv"), ("csv", "jsonl"), ("jsonl",))


def _segment():
    from hypothesis import strategies as st

    # loggers, records, the checkpoint's place among the steps so far (0 .. 1), a kill in the last record's log write
    return st.tuples(st.sampled_from(_ORDERS), st.integers(1, 3), st.floats(0, 1),
                     st.none() | st.integers(1, 40))


def test_the_csv_rows_are_the_log_records_over_random_kill_points_and_logger_orders(tmp_path_factory):
    """A property over random resume sequences through :class:`LogGroup` (each segment resumed from a checkpoint at
    or before its last step, with the table before, after or not in ``loggers``, some killed in the log's write of
    their last record at a random byte): after a last resume with the table on, its rows are the log's records."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from diffusionformer.train import read_metrics, read_metrics_csv
    from diffusionformer.train.loggers import CSVLog, open_loggers

    @settings(max_examples=40, derandomize=True, deadline=None, database=None)
    @given(segments=st.lists(_segment(), min_size=1, max_size=4))
    def run(segments):
        out = tmp_path_factory.mktemp("run")
        step = 0
        for number, (order, count, place, kill) in enumerate(segments):
            log = open_loggers(list(order), out)
            step = round(step * place)
            log.truncate(step)
            for s in range(step + 1, step + count + 1):
                record = {**_record(s), "time": 1000.0 * number + s}
                if kill is None or s < step + count:
                    log.append(record)
                    continue
                log.close()
                if order.index("jsonl") > order.index("csv") if "csv" in order else False:
                    CSVLog(out / "metrics.csv").append(record)
                with open(out / "metrics.jsonl", "ab") as f:
                    f.write(json.dumps(record).encode()[:kill])
            log.close()
            step += count
        log = open_loggers(["jsonl", "csv"], out)
        log.truncate(step)
        log.close()
        logged = [(r["step"], r["time"]) for r in read_metrics(out)]
        table = read_metrics_csv(out) if (out / "metrics.csv").exists() else []  # none where nothing was logged
        assert [(r["step"], r["time"]) for r in table] == logged

    run()


# ---- (2) _tensor_sha256 of a complex128 tensor or a conjugate view ------------------------------------------------

def test_bug_tensor_sha256_hashes_complex128_and_conjugate_views():
    """Bug: the hash of a dataset's tensors (preprocessing.json, a resume's check) raised ``KeyError: 16`` on a
    complex128 tensor and ``RuntimeError`` on a conjugate view (``x.conj()``); now each hashes its values' bits, the
    other dtypes as before (a record written before this reads the same)."""
    from diffusionformer.experiments.reload import _tensor_sha256

    z = torch.tensor([1 + 2j, -3 - 0.5j], dtype=torch.complex128)
    assert _tensor_sha256(z) == _tensor_sha256(torch.view_as_real(z))  # its float64 halves, little-endian
    assert _tensor_sha256(z) != _tensor_sha256(z.conj_physical())
    assert _tensor_sha256(z.conj()) == _tensor_sha256(z.conj_physical())
    w = z.to(torch.complex64)
    assert _tensor_sha256(w.conj()) == _tensor_sha256(w.conj_physical()) != _tensor_sha256(w)
    assert _tensor_sha256(torch.tensor(2.0, dtype=torch.complex128)) == _tensor_sha256(torch.tensor([2.0, 0.0],
                                                                                                 dtype=torch.float64))
    # the other dtypes hash as they did: the bits of each element, little-endian, in row-major order
    import hashlib
    x = torch.arange(6, dtype=torch.float32).reshape(2, 3).t()
    assert _tensor_sha256(x) == hashlib.sha256(x.contiguous().numpy().astype("<f4").tobytes()).hexdigest()[:16]


# ---- (3) a sliced or shuffled PyG in-memory set with a random transform: its graphs hashed as stored --------------

def _noisy(graph):  # an augmentation: random on every read
    graph = graph.clone()
    graph.x = graph.x + 0.01 * torch.randn_like(graph.x)
    return graph


def _in_memory_set(transform=None):
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data, InMemoryDataset

    class Graphs(InMemoryDataset):
        def __init__(self, graphs):
            super().__init__(None, transform=transform)
            self.data, self.slices = self.collate(graphs)

    g = torch.Generator().manual_seed(0)
    return Graphs([Data(x=torch.randn(3, 2, generator=g), edge_index=torch.tensor([[0, 1], [1, 2]]),
                        y=torch.tensor([i % 2])) for i in range(6)])


def test_bug_a_sliced_pyg_set_with_a_random_transform_hashes_the_same_each_time():
    """Bug: ``graphs_sha256`` of a PyG in-memory set sliced or shuffled (``dataset.shuffle()``, ``dataset[:4]``: its
    ``_indices`` set) hashed each graph as the loader reads it, transform applied: an augmentation's random noise
    made every hash another, and every resume of such a run refused as one on changed data. Now the collated tensors
    as stored, as for the whole set, and the places of the subset's graphs in them."""
    from diffusionformer.experiments.reload import _graph_set_sha256

    dataset = _in_memory_set(_noisy)
    for subset in (dataset[:4], dataset.shuffle(), dataset[torch.tensor([5, 0, 2])][1:]):
        assert _graph_set_sha256(subset) == _graph_set_sha256(subset)
    assert len({_graph_set_sha256(s) for s in (dataset, dataset[:4], dataset[1:5], dataset[[1, 0, 2, 3, 4, 5]])}) == 4
    assert _graph_set_sha256(dataset[[0, 2]]) == _graph_set_sha256(dataset[[5, 0, 2]][1:])  # the same graphs
    before = _graph_set_sha256(dataset[:4])
    dataset._data.x[0, 0] += 1.0  # a stored feature of the subset's first graph edited
    assert _graph_set_sha256(dataset[:4]) != before


def test_an_int32_edge_index_of_a_large_graph_hashes_as_its_int64_twin():
    """An int32 ``edge_index`` (PyG accepts it) of a graph of more than 46341 nodes: ``i * N + j`` overflowed int32
    (the hash weaker: two edge sets could share it); its edges are now coded in int64, as an int64 edge_index's."""
    from types import SimpleNamespace

    from diffusionformer.experiments.reload import _data_fingerprint

    N = 50_000
    edges = torch.tensor([[49_999, 3], [49_998, 49_999]])

    def fingerprint(edge_index):
        graph = SimpleNamespace(num_nodes=N, edge_index=edge_index)
        return _data_fingerprint(SimpleNamespace(kind="node", data=graph))["edge_index_sha256"]

    assert fingerprint(edges.int()) == fingerprint(edges)
