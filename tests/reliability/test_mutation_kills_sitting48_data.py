"""Mutation audit (sitting 48) of the small data modules data/images.py, idx.py, base.py, registry.py, text.py,
sequences.py, ssl.py and recall.py: tests that kill mutants the earlier tests left alive (each docstring names the
mutant). No GPU and no staged data are used (the inputs are a few bytes or tensors written here; the mnist1d
generator is replaced where its run would take an hour).

133 hand mutants (images.py 20, idx.py 18, base.py 25, registry.py 18, text.py 16, sequences.py 10, ssl.py 10,
recall.py 16), each run against the module's doctests and the tests/data and tests/reliability files that name it
(plus tests/ssl for ssl.py); the survivors of base.py, registry.py, sequences.py and recall.py then against the other
test files that name the module, those of images.py and ssl.py against the files that check their messages. 116
killed by earlier tests; 14 survivors killed here (images.py 2, idx.py 1, base.py 2, registry.py 2, text.py 3,
sequences.py 2, recall.py 2); 3 equivalent (idx.py, recall.py, ssl.py; below). No survivor showed a bug: each left a
behaviour untested, none was wrong.

Killed by earlier tests outside the first selection: images.py ``int(labels.max()) < num_classes`` -> ``<=``
(tests/models/test_edge_probes_models_third.py); base.py the empty-mask check and ``or d.y.dim() != 1`` dropped
(tests/train/test_mutation_kills_small_modules.py, tests/experiments/test_edge_probes_tasks_third.py); registry.py
``_check_seed(seed)`` dropped (tests/reliability/test_edge_probes_errors_44.py), the option-name hint's
``cutoff=0.6`` -> ``0.95`` and ``_check_option_type`` dropped (tests/data/test_edge_probes_images.py); ssl.py
``isinstance(t, (int, float))`` -> ``float`` (tests/train/test_mutation_kills_optim_checkpoint.py).

Equivalent mutants:

* idx.py ``parse_idx`` ``"truncated" if got < expected`` -> ``got <= expected``: the line runs only when
  ``got != expected``, so the two never differ.
* recall.py ``_distinct_keys`` ``rows = max(1, _KEY_BLOCK // num_keys)`` -> ``max(2, ...)``: the blocks draw the same
  uniforms from the same generator in the same order whatever their height (the docstring's point), so the keys are
  identical; only a block for more than 2**19 keys holds two rows instead of one.
* ssl.py ``SSLConfig.augmentation`` ``startswith(f"MultiCropAugment.{option} ")`` -> without the trailing space: no
  option of MultiCropAugment has a name that extends ``global_scale``, ``local_scale`` or ``ratio``, and each of
  their messages is ``"<name> must ..."``, so both prefixes match the same messages.
"""

from __future__ import annotations

import gzip

import pytest
import torch


def test_kills_idx_gzip_header_cut_inside_its_last_dimension(tmp_path):
    """kills: data/idx.py ``_read_declared`` ``len(head) < 4 + 4 * head[3]`` -> ``len(head) < 4 * head[3]`` (a
    gzipped header of 3 dims that stops after 2 of its sizes reached ``struct.unpack``: a bare ``struct.error``
    instead of the ``CorruptDataError`` naming the file; the earlier test cut it after 1 size, which both read as
    short)."""
    from diffusionformer.data import CorruptDataError
    from diffusionformer.data.idx import read_idx

    cut = bytes([0, 0, 8, 3, 0, 0, 0, 2, 0, 0, 0, 28])  # 3 dims declared, 2 of the 3 sizes present: 12 of 16 bytes
    path = tmp_path / "cut-idx3-ubyte.gz"
    path.write_bytes(gzip.compress(cut))
    with pytest.raises(CorruptDataError, match=r"cut-idx3-ubyte\.gz: truncated IDX header \(12 bytes, need 16\)"):
        read_idx(path)



def test_kills_registry_option_of_another_type_than_the_checked_ones_reaches_the_loader():
    """kills: data/registry.py ``_check_option_type`` ``if kind not in _OPTION_KINDS: return`` -> ``if default is
    None: return`` (the docstring checks only bool, int, float and str defaults: a user loader whose option
    defaults to a tuple got a bare ``KeyError: <class 'tuple'>`` for a list instead of the list)."""
    from diffusionformer.data import ClassificationData, load_dataset, register_dataset
    from diffusionformer.data.registry import _REGISTRY, _key

    seen = {}

    @register_dataset("sitting48-tuple-option", kind="image")
    def _loader(*, seed: int = 0, crop: tuple = (1, 2)) -> ClassificationData:
        seen["crop"] = crop
        x, y = torch.zeros(1, 1, 2, 2), torch.zeros(1, dtype=torch.int64)
        return ClassificationData("sitting48-tuple-option", "image", x, y, x, y, x, y, 1, (1, 2, 2))

    try:
        load_dataset("sitting48-tuple-option", crop=[3, 4])
        assert seen["crop"] == [3, 4]
    finally:
        del _REGISTRY[_key("sitting48-tuple-option")]


def test_kills_mnist1d_the_largest_documented_count_is_taken(monkeypatch):
    """kills: data/sequences.py ``load_mnist1d`` ``num_samples > _MAX_SAMPLES`` -> ``>=`` (the docstring's range
    ``[20, 10**7]`` is closed: 10**7 itself was refused). The package's generator (over an hour for 10**7) is
    replaced by one returning 20 fixed examples, and the count it was asked for is checked."""
    mdata = pytest.importorskip("mnist1d.data")
    from diffusionformer.data.sequences import load_mnist1d

    asked = []

    def fake_make_dataset(args):
        asked.append(args.num_samples)
        y = torch.arange(20) % 10
        x = torch.linspace(-1, 1, 20 * 40).reshape(20, 40)
        return {"x": x[:16].numpy(), "y": y[:16].numpy(), "x_test": x[16:].numpy(),
                "y_test": y[16:].numpy()}

    monkeypatch.setattr(mdata, "make_dataset", fake_make_dataset)
    data = load_mnist1d(num_samples=10**7, val_fraction=0.25, seed=0)
    assert asked == [10**7]
    assert data.meta["sizes"] == {"train": 12, "val": 4, "test": 4}
    with pytest.raises(ValueError, match=r"num_samples must be at most 10,000,000 .* got 10,000,001"):
        load_mnist1d(num_samples=10**7 + 1)
    assert asked == [10**7]



def test_kills_mnist1d_bool_val_fraction_refused_before_generating(monkeypatch):
    """kills: data/sequences.py ``load_mnist1d`` ``isinstance(val_fraction, bool) or`` dropped (``True`` passed the
    early check and was refused only by the split, after the package had generated every example: minutes for a
    large ``num_samples``). The generator is replaced by one that must not run."""
    mdata = pytest.importorskip("mnist1d.data")
    from diffusionformer.data.sequences import load_mnist1d

    def must_not_run(args):
        raise AssertionError(f"make_dataset ran for a bad val_fraction ({args.num_samples} samples)")

    monkeypatch.setattr(mdata, "make_dataset", must_not_run)
    for bad in (True, False, "0.1"):
        with pytest.raises(ValueError, match=rf"val_fraction must be in \[0, 1\) \(a number\), got {bad!r}"):
            load_mnist1d(val_fraction=bad, num_samples=10**6)


def test_kills_recall_the_largest_documented_vocabulary_is_taken():
    """kills: data/recall.py ``make_assoc_recall`` ``num_keys > _MAX_KEYS`` -> ``>=`` (the docstring's range
    ``vocab_size`` in ``[4, 2**25 + 1]`` is closed: 2**25 and 2**25 + 1, whose 2**24 keys float32 uniforms still
    order, were refused). One example of two pairs: one row of 2**24 uniforms (~3 s of CPU)."""
    from diffusionformer.data.recall import make_assoc_recall

    V = 2**25 + 1
    x, y = make_assoc_recall(1, 2, V, torch.Generator().manual_seed(0))
    keys, values = x[0, 0:4:2], x[0, 1:4:2]
    assert bool((keys < V // 2).all()) and keys[0] != keys[1] and bool(((values >= V // 2) & (values < V)).all())
    assert x[0, -1] in keys and y[0, :-1].tolist() == [-100] * 4 and int(y[0, -1]) == int(values[keys == x[0, -1]])
    with pytest.raises(ValueError, match=r"vocab_size must be at most 33554433 .* got 33554434"):
        make_assoc_recall(1, 2, V + 1, torch.Generator().manual_seed(0))


def test_kills_recall_zero_examples_named_as_such():
    """kills: data/recall.py ``load_assoc_recall`` ``num_examples < 1`` -> ``< 0`` (``num_examples=0`` was blamed
    on ``val_fraction``, "val_fraction=0.1 leaves the val split empty (0 of 0 examples)", sending the user to the
    wrong option)."""
    from diffusionformer.data import load_dataset

    with pytest.raises(ValueError, match=r"^num_examples must be >= 1, got 0$"):
        load_dataset("assoc-recall", num_examples=0)
    data = load_dataset("assoc-recall", num_examples=10, num_pairs=2, vocab_size=8)
    assert data.meta["sizes"] == {"train": 8, "val": 1, "test": 1}


def test_kills_text_data_token_id_equal_to_vocab_size_is_refused():
    """kills: data/base.py ``TextData.__post_init__`` ``int(t.max()) >= self.vocab_size`` -> ``>`` (a token id
    equal to ``vocab_size``, one past the vocabulary, passed and failed only at the model's embedding: a
    device-side assert on a GPU)."""
    from diffusionformer.data import TextData

    with pytest.raises(ValueError, match=r"^val: token ids must lie in \[0, 2\) \(vocab_size\), got range \[0, 2\]$"):
        TextData("t", torch.tensor([0, 1, 1]), torch.tensor([0, 2]), 2, ["a", "b"])
    assert TextData("t", torch.tensor([0, 1, 1]), torch.tensor([0, 1]), 2, ["a", "b"]).decode([1, 0]) == "ba"


def test_kills_node_data_label_of_a_test_node_beyond_the_classes_is_refused():
    """kills: data/base.py ``NodeData.__post_init__`` ``d.y[d.train_mask | d.val_mask | d.test_mask]`` ->
    ``d.y[d.train_mask | d.val_mask]`` (a label beyond the classes on a test-only node passed and failed at the
    first test evaluation, a device-side assert on a GPU). A node in no split may keep any label (-1: unlabelled)."""
    pytest.importorskip("torch_geometric")
    from torch_geometric.data import Data

    from diffusionformer.data import NodeData

    def node_data(y):
        mask = lambda *on: torch.tensor([i in on for i in range(4)])  # noqa: E731
        return NodeData("n", Data(x=torch.zeros(4, 2), edge_index=torch.tensor([[0, 1], [1, 2]]), y=torch.tensor(y),
                                  train_mask=mask(0), val_mask=mask(1), test_mask=mask(2)), 2, 2)

    with pytest.raises(ValueError, match=r"^y: labels of the train/val/test nodes must lie in \[0, 2\) "
                                         r"\(num_classes\), got range \[0, 2\]$"):
        node_data([0, 1, 2, 0])
    assert node_data([0, 1, 1, -1]).data.y.tolist() == [0, 1, 1, -1]




def test_kills_images_a_single_label_out_of_range_is_named_by_its_argument():
    """kills: data/images.py ``_checked_labels`` ``if labels.numel() and`` -> ``if labels.numel() > 1 and`` (a
    separate test set of one image labelled beyond the classes skipped the check that names the ``test`` argument of
    ``build_image_data``: the container's "test: labels" came instead, and a lone label of an image that no split
    lists passed unseen)."""
    from diffusionformer.data.images import build_image_data

    images = torch.zeros(3, 1, 2, 2, dtype=torch.uint8)
    splits = (torch.tensor([0]), torch.tensor([1]), torch.tensor([2]))
    with pytest.raises(ValueError, match=r"^build_image_data: test labels must lie in \[0, num_classes=2\), got "
                                         r"labels in \[5, 5\]$"):
        build_image_data("t", images, torch.tensor([0, 1, 0]), splits, num_classes=2, normalize=False, meta={},
                         test=(images[:1], torch.tensor([5])))
    with pytest.raises(ValueError, match=r"^build_image_data: labels must lie in \[0, num_classes=2\), got labels in "
                                         r"\[7, 7\]$"):
        one = (torch.tensor([0]), torch.tensor([0]), torch.tensor([], dtype=torch.int64))  # test: the argument
        build_image_data("t", images[:1], torch.tensor([7]), one, num_classes=2, normalize=False, meta={},
                         test=(images[:1], torch.tensor([1])))


def test_kills_registry_a_loader_without_options_says_none_are_valid():
    """kills: data/registry.py ``load_dataset`` ``", ".join(spec.options) or "none"`` -> ``", ".join(spec.options)``
    (an option passed to a user loader that takes only ``seed`` ended its message on "valid options: ", as if cut
    off; every registered dataset has options, so only a loader registered here shows it)."""
    from diffusionformer.data import ClassificationData, load_dataset, register_dataset
    from diffusionformer.data.registry import _REGISTRY, _key

    @register_dataset("sitting48-no-options", kind="image")
    def _loader(*, seed: int = 0) -> ClassificationData:  # pragma: no cover - never reached
        raise AssertionError("loaded despite an unknown option")

    try:
        with pytest.raises(TypeError, match=r"^load_dataset\('sitting48-no-options'\) got unknown option\(s\) "
                                            r"'normalize'; valid options: none$"):
            load_dataset("sitting48-no-options", normalize=False)
    finally:
        del _REGISTRY[_key("sitting48-no-options")]


def test_kills_images_a_test_set_of_other_sized_images_is_blamed_on_the_test_set():
    """kills: data/images.py ``build_image_data`` ``input_shape=tuple(images.shape[1:])`` -> the test set's shape
    when ``test`` is given (official 3x3 test images beside 2x2 training images were reported as a bad *train*
    split, sending the user to the images that are right)."""
    from diffusionformer.data.images import build_image_data

    images = torch.zeros(3, 1, 2, 2, dtype=torch.uint8)
    splits = (torch.tensor([0]), torch.tensor([1]), torch.tensor([2]))
    with pytest.raises(ValueError, match=r"^test: expected x of shape \(N, 1, 2, 2\) and y of shape \(N,\), got "
                                         r"\(2, 1, 3, 3\) and \(2,\)$"):
        build_image_data("t", images, torch.tensor([0, 1, 0]), splits, num_classes=2, normalize=False, meta={},
                         test=(torch.zeros(2, 1, 3, 3, dtype=torch.uint8), torch.tensor([1, 0])))


def test_kills_pydoc_chars_joins_the_topics_in_sorted_key_order(monkeypatch):
    """kills: data/text.py ``load_pydoc_chars`` ``for key in sorted(topics)`` -> ``for key in topics`` (the module
    docstring's "values joined in sorted key order": CPython happens to store the topics sorted, so only a dict in
    another order, put in its place here, tells the corpus from one that changes with the dict's order)."""
    import pydoc_data.topics

    from diffusionformer.data import load_dataset

    monkeypatch.setattr(pydoc_data.topics, "topics", {"with": "ddd", "assert": "ab", "lambda": "cc"})
    data = load_dataset("pydoc-chars", train_fraction=0.5)
    assert data.decode(torch.cat([data.train, data.val])) == "abccddd"
    assert data.meta["characters"] == 7 and data.itos == ["a", "b", "c", "d"]


def test_kills_tinyshakespeare_numpy_train_chars_kept_as_a_python_int(tmp_path):
    """kills: data/text.py ``load_tinyshakespeare`` ``train_chars = ... int(train_chars)`` dropped (a NumPy count, as
    a sweep grid gives, was stored as ``numpy.int64`` in ``meta["sizes"]``, which ``json.dumps`` of the run's meta
    refuses)."""
    import json

    import numpy as np

    from diffusionformer.data import load_dataset

    (tmp_path / "tinyshakespeare").mkdir()
    (tmp_path / "tinyshakespeare" / "input.txt").write_text("First Citizen:\nBefore we proceed\n", encoding="utf-8")
    data = load_dataset("tinyshakespeare", root=tmp_path, verify=False, train_chars=np.int64(5))
    assert type(data.meta["sizes"]["train"]) is int and data.meta["sizes"] == {"train": 5, "val": 4}
    assert json.loads(json.dumps(data.meta))["sizes"]["train"] == 5 and data.decode(data.train) == "First"


def test_kills_read_text_reports_only_undecodable_bytes_as_corrupt_utf8(tmp_path):
    """kills: data/text.py ``read_text`` ``except UnicodeDecodeError`` -> ``except ValueError`` (a path holding a NUL
    byte, refused by ``open`` with ``ValueError: embedded null byte``, was reported as a corrupt file that is "not
    valid UTF-8")."""
    from diffusionformer.data import CorruptDataError
    from diffusionformer.data.text import read_text

    with pytest.raises(ValueError, match=r"null byte") as caught:
        read_text(tmp_path / "in\0put.txt")
    assert not isinstance(caught.value, CorruptDataError)
    (tmp_path / "bad.txt").write_bytes(b"ab\xff")
    with pytest.raises(CorruptDataError, match=r"bad\.txt'?: not valid UTF-8"):
        read_text(tmp_path / "bad.txt")
