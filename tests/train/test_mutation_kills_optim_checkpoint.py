"""Tests written by a third mutation-testing audit of ``diffusionformer/train``, deeper into the
optimiser (``optim.py``: the weight-decay rule, the ``no_weight_decay()`` hook, the AdamW options),
the checkpoint files (``checkpoint.py``: the atomic write and its fsyncs, the refusal of hostile
or misplaced files, the model record), the process group (``distributed.py``: ``dist_env``,
``init_distributed``, barriers, shutdown, ``shard_batch``) and the SSL settings
(``data/ssl.py``: ``SSLConfig`` checks). Each kills a mutant that the existing suite let through,
checked against an independent reference: hand-listed parameter names, files and pickles written
by hand, stand-ins for ``torch.distributed`` and ``os`` calls that record what they were given,
and the documented contract (messages name the argument). CPU only, deterministic, no processes.
Each docstring names the mutant it kills; a docstring starting with "Bug:" pins a defect fixed here.
"""

from __future__ import annotations

import dataclasses
import math
import os
import pickle
import stat
import types
import zipfile
from collections.abc import Iterator, Mapping
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.serialization
from torch import nn

from diffusionformer.data.ssl import SSLConfig
from diffusionformer.train import (
    CheckpointError,
    DistContext,
    TrainConfig,
    build_optimizer,
    dist_env,
    init_distributed,
    load_checkpoint,
    param_groups,
    save_checkpoint,
    shard_batch,
)
from diffusionformer.train.checkpoint import CHECKPOINT_FORMAT, model_record, model_record_differences

# the namespace init_distributed reads resolve_device from: a doctest run of distributed.py collected
# before this file puts a second copy of the module in sys.modules, so patching the module fails
_INIT_GLOBALS = init_distributed.__globals__

CPU = torch.device("cpu")
_DIST_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK")


def _names(groups: list[dict]) -> list[tuple[float, list[str]]]:
    return [(g["weight_decay"], g["names"]) for g in groups]


def _payload(**over) -> dict:
    base = {"format": CHECKPOINT_FORMAT, "step": 2, "model": {"w": torch.arange(3.0)}, "optimizer": {},
            "rng": {}, "config": {}}
    return {**base, **over}


# ----------------------------------------------------------------------------- optim.py
class _Hooked(nn.Module):
    """A matrix, a vector and a hook that returns whatever the test hands it."""

    def __init__(self, names) -> None:
        super().__init__()
        self.proj = nn.Linear(3, 3)
        self.pos = nn.Parameter(torch.zeros(4, 3))
        self._names = names

    def no_weight_decay(self):
        return self._names


def test_a_no_weight_decay_hook_returning_one_string_is_a_type_error():
    """Kills O1 (the ``isinstance(names, str)`` check dropped: ``"pos"`` was read as the names
    ``{"p", "o", "s"}`` and refused as unknown parameters, a ValueError that hides the cause)."""
    with pytest.raises(TypeError, match=r"_Hooked\.no_weight_decay\(\): expected an iterable of parameter names, got 'pos'"):
        param_groups(_Hooked("pos"), 0.1)


def test_a_no_weight_decay_hook_returning_parameters_is_a_type_error():
    """Kills O2 (the check that every name is a ``str`` dropped: a hook returning the parameter
    objects themselves was refused as "unknown" names instead of as the wrong type)."""
    model = _Hooked(None)
    model._names = [model.pos]
    with pytest.raises(TypeError, match=r"expected an iterable of parameter names, got \[Parameter"):
        param_groups(model, 0.1)


def test_bug_a_no_weight_decay_hook_returning_a_generator_keeps_its_names():
    """Bug: a ``no_weight_decay()`` returning a generator (an iterable of names, as documented)
    was consumed by the ``str`` check and then read as empty, so the named tensors were decayed
    silently. Now the names are read once and honoured."""

    class Gen(_Hooked):
        def no_weight_decay(self) -> Iterator[str]:
            return (n for n in ["pos"])

    assert _names(param_groups(Gen(None), 0.1)) == [(0.1, ["proj.weight"]), (0.0, ["pos", "proj.bias"])]
    with pytest.raises(TypeError, match=r"expected an iterable of parameter names, got None"):
        param_groups(_Hooked(None), 0.1)


class _TiedLinear(nn.Module):
    """Two Linear layers sharing one weight (not an embedding); the hook names the second name."""

    def __init__(self) -> None:
        super().__init__()
        self.enc = nn.Linear(3, 3, bias=False)
        self.dec = nn.Linear(3, 3)
        self.dec.weight = self.enc.weight

    def no_weight_decay(self) -> set[str]:
        return {"dec.weight"}


def test_no_weight_decay_may_name_a_shared_tensor_by_its_second_name():
    """Kills O7 (the known names taken with ``remove_duplicate=True``: ``"dec.weight"`` was
    refused as unknown) and O8 (the exempt names matched with ``remove_duplicate=True``: the
    shared tensor was decayed although the hook names it). The tensor appears once, under its
    first name ``enc.weight``, in the non-decayed group."""
    assert _names(param_groups(_TiedLinear(), 0.1)) == [(0.0, ["enc.weight", "dec.bias"])]


def test_build_optimizer_uses_the_fused_kernel_on_cuda_only(monkeypatch):
    """Kills O17 (``fused`` asked for off CUDA and not on CUDA) and O22 (``weight_decay`` not
    passed as AdamW's default: a group added later with ``add_param_group`` would decay by
    torch's 0.01). ``torch.optim.AdamW`` is replaced by a stand-in that records its keywords, so
    the CUDA branch is checked without a GPU."""
    calls = []

    class Recorder:
        def __init__(self, groups, **kwargs):
            calls.append(kwargs)

    model = nn.Linear(2, 2)
    cfg = TrainConfig(lr=0.01, weight_decay=0.3, betas=(0.8, 0.9), device="cpu")
    real = build_optimizer(model, cfg, CPU)
    assert not real.defaults["fused"]
    monkeypatch.setattr(torch.optim, "AdamW", Recorder)
    build_optimizer(model, cfg, torch.device("cuda", 0))
    build_optimizer(model, cfg, CPU)
    # off CUDA, fused=None and fused=False both mean torch's non-fused AdamW
    assert [{**c, "fused": bool(c["fused"])} for c in calls] == [
        dict(lr=0.01, betas=(0.8, 0.9), weight_decay=0.3, fused=True),
        dict(lr=0.01, betas=(0.8, 0.9), weight_decay=0.3, fused=False)]


@pytest.mark.parametrize("value, error", [(-0.1, ValueError), (math.nan, ValueError), (math.inf, ValueError),
                                          (True, TypeError), ("0.1", TypeError)])
def test_bug_param_groups_refuses_a_weight_decay_that_is_not_a_finite_float_ge_0(value, error):
    """Bug: ``param_groups`` (public; documented ``weight_decay >= 0``) put any value into the
    decayed group, and ``AdamW`` checks only its own default, not a group's: a negative decay
    made the weights grow and a NaN one turned them into NaN, silently. Now a clear error names
    the argument."""
    with pytest.raises(error, match=r"param_groups: expected weight_decay"):
        param_groups(nn.Linear(2, 2), value)
    assert _names(param_groups(nn.Linear(2, 2), 0)) == [(0, ["weight"]), (0.0, ["bias"])]


# ----------------------------------------------------------------------------- checkpoint.py: writing
@pytest.mark.skipif(os.name != "posix", reason="directories are opened and fsynced on POSIX only")
def test_the_file_and_then_its_directory_are_fsynced_around_the_rename(tmp_path, monkeypatch):
    """Kills C1 (the directory fsync skipped), C2 (the file's fsync skipped), C4 (``_fsync_dir``
    not called) and C32 (the directory opened ``O_WRONLY``: ``EISDIR``, so it was silently never
    synced): the stand-in ``os.fsync`` records, for each call, whether it syncs a regular file
    or a directory and what ``path`` held at that moment. The file must be synced complete, before
    it replaces the old checkpoint, and the directory after."""
    path = tmp_path / "checkpoint.pt"
    save_checkpoint(path, {"w": torch.zeros(3)})
    old = path.read_bytes()
    real_fsync, seen = os.fsync, []

    def fsync(fd):
        st = os.fstat(fd)
        kind = "dir" if stat.S_ISDIR(st.st_mode) else "file"
        seen.append((kind, st.st_size if kind == "file" else None, path.read_bytes() == old))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    save_checkpoint(path, {"w": torch.ones(3)})
    size = path.stat().st_size
    assert seen == [("file", size, True), ("dir", None, False)]
    assert torch.load(path, weights_only=True)["w"].tolist() == [1.0, 1.0, 1.0]


def test_a_directory_that_cannot_be_opened_or_synced_does_not_fail_the_save(tmp_path, monkeypatch):
    """Kills C5 (an ``OSError`` opening the directory no longer tolerated), C6 (likewise an
    ``OSError`` from fsyncing it, as on filesystems that refuse directory fsync) and C7 (the
    directory's descriptor not closed: one leaked per checkpoint)."""
    path = tmp_path / "checkpoint.pt"
    real_open, real_close, real_fsync = os.open, os.close, os.fsync
    opened, closed = [], []

    def open_(p, flags, *args, **kwargs):
        fd = real_open(p, flags, *args, **kwargs)
        opened.append(fd)
        return fd

    def close(fd):
        closed.append(fd)
        real_close(fd)

    def fsync(fd):
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(22, "Invalid argument")
        real_fsync(fd)

    monkeypatch.setattr(os, "open", open_)
    monkeypatch.setattr(os, "close", close)
    monkeypatch.setattr(os, "fsync", fsync)
    save_checkpoint(path, {"w": torch.ones(2)})
    assert opened and set(opened) <= set(closed)

    def refuse(p, flags, *args, **kwargs):
        if Path(p) == tmp_path:
            raise PermissionError(13, "Permission denied")
        return real_open(p, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", refuse)
    save_checkpoint(path, {"w": torch.full((2,), 5.0)})
    assert torch.load(path, weights_only=True)["w"].tolist() == [5.0, 5.0]


def test_the_temporary_file_sits_beside_the_checkpoint(tmp_path, monkeypatch):
    """Kills C10 (the temporary file made in the system temp directory: ``os.replace`` across
    filesystems fails, and on one filesystem the rename is no longer within the directory that
    is fsynced)."""
    real_replace, moves = os.replace, []

    def replace(src, dst):
        moves.append((Path(src), Path(dst)))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace)
    path = tmp_path / "run" / "checkpoint.pt"
    save_checkpoint(path, {"w": torch.ones(1)})
    ((src, dst),) = moves
    assert dst == path and src.parent == path.parent and src.name.startswith(".checkpoint.pt.")
    assert sorted(p.name for p in path.parent.iterdir()) == ["checkpoint.pt"]


def test_save_creates_the_missing_parent_directories(tmp_path):
    """Kills C11 (the ``mkdir(parents=True)`` dropped: saving into a run folder that does not
    exist yet failed with ``FileNotFoundError``)."""
    path = save_checkpoint(tmp_path / "a" / "b" / "checkpoint.pt", _payload())
    assert path == tmp_path / "a" / "b" / "checkpoint.pt"
    assert load_checkpoint(path)["model"]["w"].tolist() == [0.0, 1.0, 2.0]


class _ReadOnly(Mapping):
    """A ``Mapping`` that is not a ``dict``: pickled as itself, ``weights_only`` would refuse it."""

    def __init__(self, data: dict) -> None:
        self._data = data

    def __getitem__(self, key):
        return self._data[key]

    def __iter__(self):
        return iter(self._data)

    def __len__(self) -> int:
        return len(self._data)


def test_a_payload_given_as_any_mapping_is_saved_as_a_plain_dict(tmp_path):
    """Kills C12 (``dict(payload)`` dropped: a ``Mapping`` that is not a dict was pickled with its
    class, and the checkpoint could then never be loaded with ``weights_only=True``)."""
    path = save_checkpoint(tmp_path / "checkpoint.pt", _ReadOnly(_payload(step=4)))
    assert load_checkpoint(path)["step"] == 4
    path = save_checkpoint(tmp_path / "checkpoint.pt", types.MappingProxyType(_payload(step=5)))
    assert load_checkpoint(path)["step"] == 5


# ----------------------------------------------------------------------------- checkpoint.py: reading
def test_a_missing_path_or_a_directory_is_file_not_found(tmp_path):
    """Kills C13 (``is_file`` -> ``exists``: a directory given as the checkpoint was handed to
    ``torch.load`` and reported as a corrupt checkpoint of some size)."""
    for path, what in ((tmp_path / "nothing.pt", "missing"), (tmp_path, "a directory")):
        with pytest.raises(FileNotFoundError, match=rf"load_checkpoint: expected a checkpoint file, got {what} "):
            load_checkpoint(path)


class _Hostile:
    """Pickles to a call of ``os.mkdir(marker)``: code that runs while the file is unpickled."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (str(self.marker),))


@pytest.mark.parametrize("layout", ["zip", "raw pickle"])
def test_a_hostile_checkpoint_runs_no_code_and_is_left_untouched(tmp_path, layout):
    """Kills C14 (``weights_only=False``), deeper than ``test_checkpoint_with_pickled_objects_is_refused``
    (which checks the refusal of a harmless object, not that no code ran): a file holding every
    trainer key plus an object whose unpickling calls ``os.mkdir`` must be refused before that call
    runs, whether written by ``torch.save`` (zip layout) or as a bare pickle (the legacy layout),
    and never changed."""
    marker = tmp_path / "pwned"
    path = tmp_path / "checkpoint.pt"
    payload = _payload(evil=_Hostile(marker))
    if layout == "zip":
        torch.save(payload, path)
    else:
        path.write_bytes(pickle.dumps(payload, protocol=2))
    data = path.read_bytes()
    with pytest.raises(CheckpointError, match=r"unreadable: .*weights_only=True"):
        load_checkpoint(path)
    assert not marker.exists()
    assert path.read_bytes() == data


def test_a_checkpoint_written_on_a_gpu_loads_onto_the_cpu(tmp_path, monkeypatch):
    """Kills C15 (``map_location="cpu"`` dropped: a checkpoint whose tensors were saved on
    ``cuda:0`` failed to load on a CPU-only machine, or landed on the GPU). The file is written
    with torch's location tag forced to ``"cuda:0"``, which is what a GPU run stores."""
    path = tmp_path / "checkpoint.pt"
    with monkeypatch.context() as m:
        m.setattr(torch.serialization, "location_tag", lambda storage: "cuda:0")
        save_checkpoint(path, _payload())
    w = load_checkpoint(path)["model"]["w"]
    assert w.device == CPU and w.tolist() == [0.0, 1.0, 2.0]


def _zip_with(tmp_path: Path, data_pkl: bytes | None) -> Path:
    """A checkpoint written by ``torch.save`` whose ``data.pkl`` is replaced by ``data_pkl`` (or,
    with ``None``, whose tensor records are left out)."""
    good = save_checkpoint(tmp_path / "good.pt", _payload())
    bad = tmp_path / "checkpoint.pt"
    with zipfile.ZipFile(good) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            if info.filename.endswith("/data.pkl") and data_pkl is not None:
                dst.writestr(info, data_pkl)
            elif "/data/" not in info.filename or data_pkl is not None:
                dst.writestr(info, src.read(info))
    return bad


_DAMAGED = {  # what each file makes torch.load raise (torch 2.x, weights_only=True)
    "missing tensor records": (None, "RuntimeError"),
    "invalid utf-8 in a string": (b"\x80\x02X\x01\x00\x00\x00\xff.", "UnicodeDecodeError"),
    "string length cut off": (b"\x80\x02X\x01", "error"),  # struct.error
    "reference to an unknown memo slot": (b"\x80\x02h\x05.", "KeyError"),
    "stop on an empty stack": (b"\x80\x02.", "IndexError"),
    "raw pickle cut short": ("raw", "IndexError"),
}


@pytest.mark.parametrize("damage", list(_DAMAGED))
def test_bug_every_damaged_checkpoint_is_a_checkpoint_error(tmp_path, damage):
    """Bug: ``load_checkpoint`` turned only some of ``torch.load``'s errors into
    ``CheckpointError``; a checkpoint whose pickle is cut short or damaged raised a bare
    ``struct.error``, ``KeyError`` or ``IndexError`` from torch's unpickler (found by flipping and
    cutting bytes of ``data.pkl``: about one damaged file in six), so the trainer and the
    runner could not say which file was bad. Now every failure of the load is the documented
    error, and the file is left as it was. Also kills C16 (``RuntimeError`` left out of the
    caught errors) and C19 (``ValueError`` left out: a ``UnicodeDecodeError``)."""
    data, cause = _DAMAGED[damage]
    if data == "raw":
        path = tmp_path / "checkpoint.pt"
        path.write_bytes(pickle.dumps(_payload(model={}), protocol=2)[:-3])
    else:
        path = _zip_with(tmp_path, data)
    before = path.read_bytes()
    with pytest.raises(CheckpointError, match=rf"is unreadable: .*left untouched.*Cause: {cause}"):
        load_checkpoint(path)
    assert path.read_bytes() == before


# ----------------------------------------------------------------------------- checkpoint.py: model_record
class _Outer:
    @dataclasses.dataclass
    class Cfg:
        shape: tuple[int, int] = (2, 3)
        root: Path = Path("a/b")

    class Net(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.config = _Outer.Cfg()
            self.blk = nn.Linear(2, 2)
            self.blk.heads_spec = lambda: ("attention", "laplacian")
            self.other = nn.Linear(2, 2)
            self.other.heads_spec = None  # an attribute of that name, not a method


def test_model_record_is_plain_json_with_the_qualified_class_name():
    """Kills C23 (``callable(...)`` -> ``hasattr``: an attribute named ``heads_spec`` that is not
    a method was called), C24 (the JSON round trip dropped: tuples and a ``Path`` stayed, and a
    ``Path`` makes the checkpoint unloadable with ``weights_only``) and C25 (``__qualname__`` ->
    ``__name__``: two nested classes of one name were the same model)."""
    record = model_record(_Outer.Net())
    assert record == {"class": f"{__name__}._Outer.Net", "config": {"shape": [2, 3], "root": "a/b"},
                      "heads": {"blk": ["attention", "laplacian"]}}


def test_model_record_ignores_a_dataclass_type_stored_as_config():
    """Kills C22 (the ``not isinstance(cfg, type)`` guard dropped: a model whose ``config`` is a
    dataclass *class* made ``dataclasses.asdict`` raise a TypeError at every checkpoint)."""
    model = nn.Linear(2, 2)
    model.config = _Outer.Cfg
    assert model_record(model) == {"class": "torch.nn.modules.linear.Linear", "config": None, "heads": {}}


def test_model_record_differences_see_keys_present_on_one_side_only():
    """Kills C26 (config keys compared over the intersection: a field added since the checkpoint
    went unseen), C27 (head layers compared over the saved ones only: a layer added since went
    unseen) and C31 (the current config compared with the saved one itself)."""
    saved = {"class": "m.Net", "config": {"dim": 8, "gone": 1}, "heads": {"a": [1]}}
    now = {"class": "m.Net", "config": {"dim": 16, "new": True}, "heads": {"a": [1], "b": [2]}}
    assert model_record_differences(saved, now) == [
        "config dim: checkpoint 8, now 16", "config gone: checkpoint 1, now None",
        "config new: checkpoint None, now True", "heads of b: checkpoint None, now [2]"]
    assert model_record_differences(now, now) == []


# ----------------------------------------------------------------------------- distributed.py
@pytest.fixture
def no_dist_env(monkeypatch):
    for var in _DIST_VARS + ("MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(var, raising=False)
    return monkeypatch


def test_dist_env_takes_the_local_rank_from_the_rank_when_unset(no_dist_env):
    """Kills D1 (``LOCAL_RANK`` defaulting to 0: on one node every process without it would
    claim GPU 0)."""
    no_dist_env.setenv("WORLD_SIZE", "3")
    no_dist_env.setenv("RANK", "2")
    assert dist_env() == (2, 3, 2)
    no_dist_env.setenv("LOCAL_RANK", "0")
    assert dist_env() == (2, 3, 0)


def test_bug_dist_env_refuses_a_negative_local_rank(no_dist_env):
    """Bug: ``LOCAL_RANK=-1`` was accepted, and it picks the CUDA device, so the run failed later at
    ``cuda:-1`` with a message naming no variable. It is now a ValueError naming ``LOCAL_RANK``."""
    for k, v in {"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "-1"}.items():
        no_dist_env.setenv(k, v)
    with pytest.raises(ValueError, match=r"distributed environment: expected LOCAL_RANK >= 0, got LOCAL_RANK=-1"):
        dist_env()
    no_dist_env.setenv("LOCAL_RANK", "0")
    assert dist_env() == (1, 2, 0)


@pytest.mark.parametrize("env", [{"WORLD_SIZE": "2"}, {"WORLD_SIZE": "2", "RANK": "one"},
                                 {"WORLD_SIZE": "two", "RANK": "0"}, {"WORLD_SIZE": "2", "RANK": "-1"}])
def test_dist_env_refuses_a_missing_or_bad_rank_with_a_value_error(no_dist_env, env):
    """Kills D2 (``KeyError`` not turned into the ValueError: a missing ``RANK`` escaped as a bare
    KeyError), D3 (``ValueError`` from ``int()`` not reworded: no mention of torchrun) and D4 (the
    lower bound ``0 <= RANK`` dropped: ``RANK=-1`` was accepted)."""
    for k, v in env.items():
        no_dist_env.setenv(k, v)
    with pytest.raises(ValueError, match=r"distributed environment: expected (integer RANK|0 <= RANK < WORLD_SIZE)"):
        dist_env()


def test_the_main_process_is_global_rank_0_not_each_nodes_first():
    """Kills D22 (``is_main`` read from the local rank: on two nodes both first processes wrote
    the metrics, checkpoints and summary)."""
    assert [DistContext(r, 4, r % 2, CPU).is_main for r in range(4)] == [True, False, False, False]


@pytest.fixture
def recorded_dist(monkeypatch):
    """``torch.distributed`` calls replaced by stand-ins that record them."""
    calls: list = []
    monkeypatch.setattr(dist, "barrier", lambda **kw: calls.append(("barrier", kw)))
    monkeypatch.setattr(dist, "destroy_process_group", lambda: calls.append(("destroy",)))
    monkeypatch.setattr(dist, "init_process_group", lambda **kw: calls.append(("init", kw)))
    monkeypatch.setattr(torch.cuda, "set_device", lambda d: calls.append(("set_device", d)))
    return calls


def test_barrier_names_the_cuda_device_and_not_a_cpu_one(recorded_dist):
    """Kills D6 (the CUDA barrier without ``device_ids``: NCCL then guesses the device, and hangs
    when it guesses another rank's)."""
    DistContext(1, 2, 1, torch.device("cuda", 1)).barrier()
    DistContext(1, 2, 0, CPU).barrier()
    DistContext(0, 1, 0, torch.device("cuda", 0)).barrier()  # one process: nothing to wait for
    assert recorded_dist == [("barrier", {"device_ids": [1]}), ("barrier", {})]


def test_shutdown_destroys_only_a_live_group_it_created(recorded_dist, monkeypatch):
    """Kills D8 (``owns_group`` ignored: a group the caller created was destroyed under it) and D9
    (``is_initialized`` ignored: a group already destroyed was destroyed again, an error)."""
    live = [True]
    monkeypatch.setattr(dist, "is_initialized", lambda: live[0])
    DistContext(0, 2, 0, CPU, owns_group=False).shutdown()
    assert recorded_dist == []
    DistContext(0, 2, 0, CPU, owns_group=True).shutdown()
    assert recorded_dist == [("destroy",)]
    live[0] = False
    DistContext(0, 2, 0, CPU, owns_group=True).shutdown()
    assert recorded_dist == [("destroy",)]


def test_init_distributed_joins_an_existing_group_without_owning_it(no_dist_env, recorded_dist):
    """Kills D10 (a caller's group marked as owned: ``shutdown`` then destroyed it), D11 (the
    local rank defaulting to 0 instead of the group rank when ``LOCAL_RANK`` is unset), D15 (the
    local rank passed to ``resolve_device`` in a one-process group) and D20 (the rank not read
    from the group)."""
    devices = []

    def resolve(spec, local_rank=None):
        devices.append((spec, local_rank))
        return CPU

    no_dist_env.setitem(_INIT_GLOBALS, "resolve_device", resolve)
    no_dist_env.setattr(dist, "is_initialized", lambda: True)
    no_dist_env.setattr(dist, "get_rank", lambda: 1)
    no_dist_env.setattr(dist, "get_world_size", lambda: 3)
    assert init_distributed("auto") == DistContext(1, 3, 1, CPU, owns_group=False)
    no_dist_env.setattr(dist, "get_rank", lambda: 0)
    no_dist_env.setattr(dist, "get_world_size", lambda: 1)
    no_dist_env.setenv("LOCAL_RANK", "0")
    assert init_distributed("auto") == DistContext(0, 1, 0, CPU, owns_group=False)
    assert devices == [("auto", 1), ("auto", None)]
    assert recorded_dist == []  # no group made, no device switched on the CPU


def test_init_distributed_under_torchrun_creates_and_owns_the_group(no_dist_env, recorded_dist):
    """Kills D12 (the group it created not marked as owned: never destroyed), D13 (NCCL asked for
    on the CPU instead of Gloo) and D14 (``LOCAL_RANK`` not passed to ``resolve_device``: every
    process of a node on the same GPU). The CUDA branch runs with stand-ins, without a GPU."""
    no_dist_env.setattr(dist, "is_initialized", lambda: False)
    no_dist_env.setenv("WORLD_SIZE", "2")
    no_dist_env.setenv("RANK", "1")
    no_dist_env.setenv("LOCAL_RANK", "1")
    devices = []
    target = [CPU]

    def resolve(spec, local_rank=None):
        devices.append((spec, local_rank))
        return target[0]

    no_dist_env.setitem(_INIT_GLOBALS, "resolve_device", resolve)
    assert init_distributed("cpu") == DistContext(1, 2, 1, CPU, owns_group=True)
    target[0] = torch.device("cuda", 1)
    assert init_distributed("cuda") == DistContext(1, 2, 1, torch.device("cuda", 1), owns_group=True)
    assert devices == [("cpu", 1), ("cuda", 1)]
    assert recorded_dist == [("init", {"backend": "gloo"}), ("set_device", torch.device("cuda", 1)),
                             ("init", {"backend": "nccl", "device_id": torch.device("cuda", 1)})]


def test_shard_batch_walks_any_mapping_and_keeps_plain_leaves():
    """Kills D16 (``Mapping`` -> ``dict``: a read-only mapping batch was refused), D17 (``None``
    leaves refused: an optional field such as a missing mask) and D18 (``float`` and ``bytes``
    leaves refused)."""
    batch = types.MappingProxyType({"x": torch.arange(6), "mask": None, "scale": 0.5, "tag": b"ab",
                                    "n": 3, "flag": True, "name": "s"})
    got = shard_batch(batch, 2, 3)
    assert type(got) is dict and got["x"].tolist() == [4, 5]
    assert {k: v for k, v in got.items() if k != "x"} == {"mask": None, "scale": 0.5, "tag": b"ab", "n": 3,
                                                           "flag": True, "name": "s"}


@pytest.mark.parametrize("rank, world_size, error, pattern", [
    (3, 3, ValueError, r"0 <= rank < world_size, got rank=3 world_size=3"),
    (-1, 3, ValueError, r"got rank=-1 world_size=3"),
    (0, 0, ValueError, r"got rank=0 world_size=0"),
    (0, -2, ValueError, r"got rank=0 world_size=-2"),
    (True, 2, TypeError, r"rank an int, got bool"),
    (0, 2.0, TypeError, r"world_size an int, got float")])
def test_bug_shard_batch_refuses_a_rank_outside_the_world(rank, world_size, error, pattern):
    """Bug: ``shard_batch`` with ``rank >= world_size`` returned an empty slice (``rank=-1`` an
    empty one too) and ``world_size=0`` a ZeroDivisionError: a wrong rank trained on nothing,
    silently. Now a clear error names the arguments (TypeError for a non-int, ValueError for a range)."""
    with pytest.raises(error, match=rf"shard_batch: expected .*{pattern}"):
        shard_batch({"x": torch.arange(6)}, rank, world_size)
    assert shard_batch({"x": torch.arange(6)}, 2, 3)["x"].tolist() == [4, 5]


# ----------------------------------------------------------------------------- data/ssl.py
@pytest.mark.parametrize("value", [2.5, "3", None])
def test_ssl_config_knn_k_must_be_an_int(value):
    """Kills L1 (the ``int`` check on ``knn_k`` dropped: 2.5 passed, ``"3"`` raised a TypeError
    from the comparison instead of the ValueError naming the field)."""
    with pytest.raises(ValueError, match=rf"SSLConfig\.knn_k must be an int >= 1, got {value!r}"):
        SSLConfig(knn_k=value)


@pytest.mark.parametrize("value", [True, math.nan, "0.07", -0.0])
def test_ssl_config_knn_temperature_must_be_a_positive_number(value):
    """Kills L2 (a bool accepted as temperature 1), L3 (``not t > 0`` -> ``t <= 0``: NaN
    accepted) and L5 (the number check dropped: ``"0.07"`` raised a TypeError from the
    comparison)."""
    with pytest.raises(ValueError, match=r"SSLConfig\.knn_temperature must be positive"):
        SSLConfig(knn_temperature=value)


def test_ssl_config_accepts_an_int_temperature():
    """Kills L4 (``int`` left out of the accepted temperature types: ``knn_temperature = 1`` in a
    TOML file is an int and was refused)."""
    assert SSLConfig(knn_temperature=1).knn_temperature == 1


def test_ssl_config_local_crops_error_names_its_own_field():
    """Kills L6 (the ``int`` check on ``local_crops`` dropped: 1.5 was refused only by
    ``MultiCropAugment``, under the augmentation's field name)."""
    with pytest.raises(ValueError, match=r"^SSLConfig\.local_crops must be an int >= 0, got 1\.5$"):
        SSLConfig(local_crops=1.5)


def test_ssl_config_passes_brightness_and_contrast_to_their_own_fields():
    """Kills L10 (``brightness`` and ``contrast`` swapped on the way to ``MultiCropAugment``: the
    defaults are both 0.4, so only different values show it)."""
    aug = SSLConfig(brightness=0.3, contrast=0.2).augmentation()
    assert (aug.brightness, aug.contrast) == (0.3, 0.2)


# ----------------------------------------------------------------------------- equivalent mutants
# O21 optim.py ``fused=fused or None`` -> ``fused=fused``: off CUDA ``fused=False`` and ``fused=None``
#     both select torch's non-fused AdamW, on CUDA both are ``True``; nothing observable differs
#     (``test_build_optimizer_uses_the_fused_kernel_on_cuda_only`` compares ``bool(fused)`` on purpose).
# C3  checkpoint.py ``f.flush()`` dropped before ``os.fsync``: ``torch.save`` flushes the file object
#     itself when its zip writer closes (``os.fstat(f.fileno()).st_size`` already equals the final
#     size when ``torch.save`` returns), so the bytes reach the kernel before the fsync either way.
#     The flush stays as the guarantee should torch stop flushing.
# Not run as mutants, equivalent by reading: distributed.py ``world_size < 1 or`` in ``dist_env`` (no
#     rank satisfies ``0 <= rank < world_size`` when ``world_size < 1``); checkpoint.py ``os.replace``
#     -> ``os.rename`` (the same call on POSIX).


# ----------------------------------------------------------------------------- file modes
@pytest.mark.skipif(os.name != "posix", reason="POSIX file modes")
@pytest.mark.parametrize("umask", [0o022, 0o077, 0o002])
def test_bug_checkpoints_and_run_files_get_the_mode_open_would_give(tmp_path, umask):
    """Bug: ``save_checkpoint`` and the atomic text writers (``summary.json``, ``metrics.csv``...) wrote
    through ``tempfile.mkstemp``, so every such file was ``0600`` whatever the umask: on a shared
    cluster a group that may read the run folder could not read its checkpoints or logs. They now get
    the mode a plain ``open()`` gives (the reference file below), so a private umask still keeps them private."""
    from diffusionformer.train.metrics import write_text_atomic

    old = os.umask(umask)
    try:
        reference = tmp_path / "reference"
        reference.write_text("x")
        ckpt = save_checkpoint(tmp_path / "checkpoint.pt", _payload())
        write_text_atomic(tmp_path / "summary.json", "{}")
    finally:
        os.umask(old)
    expected = stat.S_IMODE(reference.stat().st_mode)
    assert expected == 0o666 & ~umask
    assert stat.S_IMODE(ckpt.stat().st_mode) == expected
    assert stat.S_IMODE((tmp_path / "summary.json").stat().st_mode) == expected
    assert load_checkpoint(ckpt)["step"] == 2
