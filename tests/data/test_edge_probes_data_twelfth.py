"""Edge-case probes of the data containers (base.py) and of mnist1d's val check (twelfth pass).

Found and fixed (tests whose docstring starts with "Bug:"):

* ``SequenceTaskData``: ``vocab_size`` 3.0 or True and ``ignore_index`` 1.5 were accepted (``TextData`` refuses
  them); input tokens or targets outside ``[0, vocab_size)`` (targets other than ``ignore_index``) passed and
  failed later at the model's embedding or loss; a 1-D split was a bare ``IndexError``, a list an
  ``AttributeError``; a val/test split of another length ``T`` than train's passed.
* ``ClassificationData``: ``num_classes`` 3.0 or True passed; labels outside ``[0, num_classes)`` passed; a
  ``(N, 1)`` ``y`` passed although the message promises ``(N,)``.
* ``NodeData``: ``edge_index`` of another dtype or shape than int64 ``(2, E)``, or naming nodes ``>= num_nodes``,
  passed; ``num_classes``/``num_features`` 2.0 or True passed.
* sequences.py ``load_mnist1d``: an empty val split was reported as "0 of 20 examples" for ``num_samples=20``,
  counting the package's 4 test examples, though val is carved from its 16 training examples.

Probed and found sound: the restricted unpickler's ``numpy.dtype`` (a BUILD on the shared ``float64`` dtype
leaves it unchanged), registry options and seeds of the wrong type, a data root that is a file.
"""

from __future__ import annotations

import pytest
import torch
from torch_geometric.data import Data

from diffusionformer.data import load_dataset
from diffusionformer.data.base import ClassificationData, NodeData, SequenceTaskData


def _seq(**kw):
    x = torch.zeros(4, 5, dtype=torch.long)
    y = torch.full((4, 5), -100)
    y[:, -1] = 1
    args = dict(name="s", x_train=x, y_train=y, x_val=x, y_val=y, x_test=x, y_test=y, vocab_size=3)
    args.update(kw)
    return SequenceTaskData(**args)


def _cls(**kw):
    x, y = torch.zeros(4, 1, 2, 2), torch.tensor([0, 1, 2, 0])
    args = dict(name="c", kind="image", x_train=x, y_train=y, x_val=x, y_val=y, x_test=x, y_test=y, num_classes=3,
                input_shape=(1, 2, 2))
    args.update(kw)
    return ClassificationData(**args)


def _node(num_classes=2, num_features=2, **kw):
    d = dict(x=torch.zeros(3, 2), edge_index=torch.tensor([[0, 1], [1, 2]]), y=torch.tensor([0, 1, 0]),
             train_mask=torch.tensor([True, False, False]), val_mask=torch.tensor([False, True, False]),
             test_mask=torch.tensor([False, False, True]))
    d.update(kw)
    return NodeData("n", Data(**d), num_classes, num_features)


@pytest.mark.parametrize("field, value", [("vocab_size", 3.0), ("vocab_size", True), ("ignore_index", 1.5)])
def test_bug_sequence_task_data_sizes_must_be_ints(field, value):
    """Bug: SequenceTaskData kept ``vocab_size=3.0`` or ``True`` (and ``ignore_index=1.5``), which TextData
    refuses: the float reached the model's config."""
    with pytest.raises(TypeError, match=rf"{field} must be an int, got {value!r}"):
        _seq(**{field: value})
    assert type(_seq().vocab_size) is int


@pytest.mark.parametrize("where, bad, match", [
    ("x_train", torch.full((4, 5), 3), r"train: input tokens must lie in \[0, 3\) \(vocab_size\), got range \[3, 3\]"),
    ("x_val", torch.full((4, 5), -1), r"val: input tokens must lie in \[0, 3\).*\[-1, -1\]"),
    ("y_test", torch.full((4, 5), 7), r"test: targets must lie in \[0, 3\) \(vocab_size\) or ignore_index \(-100\)"),
    ("y_train", torch.full((4, 5), -1), r"train: targets must lie in .*got range \[-1, -1\]"),
])
def test_bug_sequence_task_data_ids_outside_the_vocabulary(where, bad, match):
    """Bug: SequenceTaskData accepted input tokens and targets outside ``[0, vocab_size)`` (targets other than
    ``ignore_index``): they failed only at the model's embedding or loss (a device-side assert on a GPU)."""
    with pytest.raises(ValueError, match=match):
        _seq(**{where: bad})


def test_bug_sequence_task_data_shapes_and_types():
    """Bug: a 1-D split was a bare ``IndexError``, a list an ``AttributeError``, and a val split of another
    length than train's (the model's block size is ``seq_len``, train's) was accepted."""
    x = torch.zeros(5, dtype=torch.long)
    with pytest.raises(ValueError, match=r"train: expected int64 inputs and targets of the same shape \(N, T\)"):
        _seq(x_train=x, y_train=x)
    with pytest.raises(ValueError, match=r"train: expected int64 tensors, got list and Tensor"):
        _seq(x_train=[[0]])
    x, y = torch.zeros(4, 3, dtype=torch.long), torch.zeros(4, 3, dtype=torch.long)
    with pytest.raises(ValueError, match=r"val: expected .*T the train split's, got torch.int64 \(4, 3\)"):
        _seq(x_val=x, y_val=y)


@pytest.mark.parametrize("value", [3.0, True])
def test_bug_classification_num_classes_must_be_an_int(value):
    """Bug: ClassificationData kept ``num_classes=3.0`` or ``True`` and handed it to the model's head."""
    with pytest.raises(TypeError, match=rf"num_classes must be an int, got {value!r}"):
        _cls(num_classes=value)


@pytest.mark.parametrize("labels, seen", [([0, 1, 3, 0], r"\[0, 3\]"), ([0, -1, 2, 0], r"\[-1, 2\]")])
def test_bug_classification_labels_outside_the_classes(labels, seen):
    """Bug: ClassificationData accepted labels outside ``[0, num_classes)``: the loss failed at the first step
    (a device-side assert on a GPU)."""
    with pytest.raises(ValueError, match=rf"val: labels must lie in \[0, 3\) \(num_classes\), got range {seen}"):
        _cls(y_val=torch.tensor(labels))


def test_bug_classification_y_must_be_one_dimensional():
    """Bug: a ``(N, 1)`` y passed although the message promises ``y of shape (N,)``."""
    with pytest.raises(ValueError, match=r"test: expected x of shape \(N, 1, 2, 2\) and y of shape \(N,\), got .* "
                                         r"and \(4, 1\)"):
        _cls(y_test=torch.zeros(4, 1, dtype=torch.long))


@pytest.mark.parametrize("edge_index, match", [
    (torch.tensor([[0, 1], [1, 7]]), r"edge_index: node ids must lie in \[0, 3\) \(num_nodes\), got range \[0, 7\]"),
    (torch.tensor([[0, -1], [1, 2]]), r"edge_index: node ids must lie in \[0, 3\).*\[-1, 2\]"),
    (torch.tensor([[0.0, 1.0], [1.0, 2.0]]), r"edge_index to be an int64 tensor of shape \(2, E\), got torch.float32"),
    (torch.tensor([[0, 1, 1]]), r"edge_index to be an int64 tensor of shape \(2, E\), got torch.int64 of shape \(1, 3\)"),
])
def test_bug_node_data_edge_index_checked(edge_index, match):
    """Bug: NodeData accepted an ``edge_index`` of floats, of shape ``(1, E)``, or naming nodes outside
    ``[0, num_nodes)``: message passing failed later (or gathered other memory)."""
    with pytest.raises(ValueError, match=match):
        _node(edge_index=edge_index)


@pytest.mark.parametrize("field, value", [("num_classes", 2.0), ("num_features", True)])
def test_bug_node_data_sizes_must_be_ints(field, value):
    """Bug: NodeData kept ``num_classes=2.0`` or ``num_features=True`` (True == 1 matched a 1-column x)."""
    kw = {field: value}
    if field == "num_features":
        kw["x"] = torch.zeros(3, 1)
    with pytest.raises(TypeError, match=rf"{field} must be an int, got {value!r}"):
        _node(**kw)


def test_bug_mnist1d_empty_val_counts_the_training_examples():
    """Bug: mnist1d's empty-val message counted all 20 examples ("0 of 20") where val is carved from the
    package's 16 training examples (the 4 test examples are the package's own)."""
    pytest.importorskip("mnist1d")
    with pytest.raises(ValueError, match=r"mnist1d: val_fraction=0.01 leaves the val split empty \(0 of the "
                                         r"package's 16 training examples\)"):
        load_dataset("mnist1d", num_samples=20, val_fraction=0.01)
