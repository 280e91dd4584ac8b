"""Edge probes: hostile and corrupt files under a data root (sparse gzip files, FIFOs, pickles that run code)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest


REPO = Path(__file__).resolve().parents[2]

# run in a fresh interpreter whose address space is capped at 3 GiB: a regression that reads a sparse file of 1 TiB
# whole is then a MemoryError there, never a machine filling its memory
_SPARSE_GZ = textwrap.dedent("""
    import gzip, resource, struct, sys
    from pathlib import Path
    resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))
    from diffusionformer.data.idx import read_idx_bytes
    from diffusionformer.data.paths import CorruptDataError
    path = Path(sys.argv[1]) / "t10k-labels-idx1-ubyte.gz"
    path.write_bytes(gzip.compress(struct.pack(">II", 0x801, int(sys.argv[2])) + bytes([1, 2, 3])))
    with open(path, "r+b") as f:
        f.truncate(1 << 40)  # sparse: a gzip member then 1 TiB of zeros that take no disk space
    try:
        read_idx_bytes(path)
        print("READ")
    except CorruptDataError as err:
        print("CORRUPT", err)
    except MemoryError:
        print("MEMORYERROR")
""")


@pytest.mark.skipif(sys.platform != "linux", reason="RLIMIT_AS and sparse files as on Linux")
def test_bug_a_sparse_gzip_idx_file_of_a_terabyte_is_refused_unread(tmp_path):
    """Bug: ``read_idx_bytes`` bounded what it took from the gzip *stream* but first read the ``.gz`` file itself
    whole (``plain.read()``), so a sparse ``.gz`` of 1 TiB (three labels, then zeros that take no disk space) was a
    bare ``MemoryError`` naming no file (streaming it instead crawls: gzip skips zero padding byte by byte). A ``.gz``
    larger than any IDX archive (1 GiB) is now a :class:`CorruptDataError` naming the file, before it is read."""
    out = subprocess.run([sys.executable, "-c", _SPARSE_GZ, str(tmp_path), "3"], capture_output=True,
                         text=True, timeout=120, cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.startswith("CORRUPT"), out.stdout + out.stderr[-2000:]
    assert "t10k-labels-idx1-ubyte.gz" in out.stdout


class _Touch:
    """A pickle payload: unpickling it calls ``open(<marker>, "w")``, creating the marker file."""

    def __init__(self, marker: Path) -> None:
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_pins_a_cifar_batch_or_planetoid_file_never_runs_a_pickled_call(tmp_path):
    """Pin: the restricted unpicklers of CIFAR batches and Planetoid ``ind.*`` files refuse ``builtins.open`` (or any
    call outside NumPy's array rebuild) as a :class:`CorruptDataError` naming the file, and the marker the payload
    would create is never created (a plain ``pickle.load`` creates it, checked first)."""
    import pickle

    from diffusionformer.data.cifar10 import read_cifar_batch
    from diffusionformer.data.paths import CorruptDataError
    from diffusionformer.data.planetoid import read_planetoid

    probe = tmp_path / "plain_marker"
    pickle.loads(pickle.dumps(_Touch(probe), protocol=2)).close()
    assert probe.exists()  # the payload does run under an unrestricted unpickler
    marker = tmp_path / "marker"
    batch = tmp_path / "data_batch_1"
    batch.write_bytes(pickle.dumps({b"data": _Touch(marker), b"labels": [0]}, protocol=2))
    with pytest.raises(CorruptDataError, match="data_batch_1"):
        read_cifar_batch(batch)
    folder = tmp_path / "raw"
    folder.mkdir()
    for part in ("x", "tx", "allx", "y", "ty", "ally", "graph"):
        (folder / f"ind.toy.{part}").write_bytes(pickle.dumps(_Touch(marker), protocol=2))
    (folder / "ind.toy.test.index").write_text("0\n")
    with pytest.raises(CorruptDataError, match=r"ind\.toy\."):
        read_planetoid(folder, "toy")
    assert not marker.exists()


def test_bug_a_tu_zip_with_two_entries_of_one_name_is_refused(tmp_path):
    """Bug: ``extract_tu_zip`` flattens entries by file name, so ``MUTAG/MUTAG_A.txt`` and ``other/MUTAG_A.txt`` were
    both written to ``raw/MUTAG_A.txt``, the later silently replacing the first (the CIFAR reader refuses such
    duplicates); the archive is refused naming both entries, and nothing is extracted."""
    import zipfile

    from diffusionformer.data import tu
    from diffusionformer.data.paths import CorruptDataError

    path = tmp_path / "MUTAG.zip"
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("MUTAG/MUTAG_A.txt", "1, 2\n2, 1\n")
        zf.writestr("MUTAG/MUTAG_graph_indicator.txt", "1\n1\n")
        zf.writestr("MUTAG/MUTAG_graph_labels.txt", "1\n")
        zf.writestr("other/MUTAG_A.txt", "1, 1\n")
    raw = tmp_path / "cache" / "MUTAG" / "raw"
    with pytest.raises(CorruptDataError, match=r"two entries named MUTAG_A\.txt \('MUTAG/MUTAG_A\.txt' and "
                                               r"'other/MUTAG_A\.txt'\)"):
        tu.extract_tu_zip(path, "MUTAG", raw, "digest")
    assert not raw.exists() or not any(raw.iterdir())
