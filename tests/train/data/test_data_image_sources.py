"""digits, MNIST (IDX) and CIFAR-10 (binary records), from small files written here."""

import gzip
import hashlib
import os
import shutil
import struct
import tarfile

import numpy as np
import pytest

from pocket.errors import PocketError
from pocket.train.data import DataError, cifar, load_dataset, mnist, sources

# ---- writers, straight from the published formats ---------------------------------------------


def write_idx(path, arr, gz=False, magic=None):
    arr = np.asarray(arr, np.uint8)
    magic = (0x08 << 8 | arr.ndim) if magic is None else magic
    data = struct.pack(">I", magic) + struct.pack(">" + "I" * arr.ndim, *arr.shape) + arr.tobytes()
    with (gzip.open if gz else open)(path, "wb") as f:
        f.write(data)


def make_mnist(folder, gz, n_train=40, n_test=12, h=28, w=28, seed=1):
    rng = np.random.default_rng(seed)
    raw = {
        "train_x": rng.integers(0, 256, (n_train, h, w)),
        "train_y": np.arange(n_train) % 10,
        "test_x": rng.integers(0, 256, (n_test, h, w)),
        "test_y": rng.integers(0, 10, n_test),
    }
    sfx = ".gz" if gz else ""
    os.makedirs(folder, exist_ok=True)
    write_idx(os.path.join(folder, "train-images-idx3-ubyte" + sfx), raw["train_x"], gz)
    write_idx(os.path.join(folder, "train-labels-idx1-ubyte" + sfx), raw["train_y"], gz)
    write_idx(os.path.join(folder, "t10k-images-idx3-ubyte" + sfx), raw["test_x"], gz)
    write_idx(os.path.join(folder, "t10k-labels-idx1-ubyte" + sfx), raw["test_y"], gz)
    return raw


def cifar_bytes(x, y):
    # one record: label byte, then R plane, G plane, B plane (32x32 each, row-major)
    return b"".join(bytes([int(label)]) + img.astype(np.uint8).tobytes() for img, label in zip(x, y))


def make_cifar(folder, per_batch=4, n_test=6, seed=2):
    rng = np.random.default_rng(seed)
    d = os.path.join(folder, "cifar-10-batches-bin")
    os.makedirs(d)
    xs, ys = [], []
    for i in range(1, 6):
        x = rng.integers(0, 256, (per_batch, 3, 32, 32))
        y = rng.integers(0, 10, per_batch)
        with open(os.path.join(d, f"data_batch_{i}.bin"), "wb") as f:
            f.write(cifar_bytes(x, y))
        xs.append(x)
        ys.append(y)
    xt, yt = rng.integers(0, 256, (n_test, 3, 32, 32)), rng.integers(0, 10, n_test)
    with open(os.path.join(d, "test_batch.bin"), "wb") as f:
        f.write(cifar_bytes(xt, yt))
    return np.concatenate(xs), np.concatenate(ys), xt, yt


def tar_folder(folder, archive):
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(os.path.join(folder, "cifar-10-batches-bin"), arcname="cifar-10-batches-bin")


def expected_norm(raw_train, raw, pixel_max):
    """Normalize `raw` with per-channel stats of `raw_train`, computed here independently."""
    t = raw_train.astype(np.float64) / pixel_max
    mean = t.mean(axis=(0, 2, 3))
    std = t.std(axis=(0, 2, 3))
    return (raw / pixel_max - mean[:, None, None]) / std[:, None, None], mean, std


def sort_rows(a):
    flat = a.reshape(a.shape[0], -1)
    return flat[np.lexsort(flat.T[::-1])]


# ---- digits ----------------------------------------------------------------------------------


def test_digits_bundled():
    pytest.importorskip("sklearn")
    from sklearn.datasets import load_digits

    d = load_dataset("digits", test_fraction=0.2, val_fraction=0.1)
    assert d.name == "digits" and d.task == "classification"
    assert d.labels == [str(i) for i in range(10)] and d.num_outputs == 10
    assert d.input_shape == (1, 8, 8)
    assert len(d.train) + len(d.val) + len(d.test) == 1797
    assert abs(len(d.test) - 0.2 * 1797) <= 1
    assert abs(len(d.val) - 0.1 * (1797 - len(d.test))) <= 1
    p = d.preprocessing
    assert p["layout"] == "NCHW" and p["channels"] == 1 and p["image_size"] == [8, 8]
    assert p["pixel_max"] == 16 and p["scale"] == pytest.approx(1 / 16)
    assert d.train.x.dtype == np.float32 and d.train.y.dtype == np.int64
    # train stats define the normalization: normalized train pixels have mean 0, std 1
    assert d.train.x.mean() == pytest.approx(0, abs=1e-5)
    assert d.train.x.std() == pytest.approx(1, abs=1e-4)
    # and undoing it on the test split gives back real digits pixels (integers 0..16)
    raw_test = (d.test.x * p["std"][0] + p["mean"][0]) / p["scale"]
    assert np.allclose(raw_test, np.round(raw_test), atol=1e-3)
    digits = load_digits()
    all_rows = {r.tobytes() for r in digits.images.reshape(-1, 64).astype(np.uint8)}
    assert all(r.tobytes() in all_rows for r in np.round(raw_test).reshape(-1, 64).astype(np.uint8))


def test_digits_test_split_is_stable_across_seeds():
    pytest.importorskip("sklearn")
    a = load_dataset("digits", seed=0)
    b = load_dataset("digits", seed=1)
    assert np.array_equal(a.test.y, b.test.y)
    assert not np.array_equal(a.val.y, b.val.y) or not np.array_equal(a.val.x, b.val.x)


def test_limit_caps_every_split():
    pytest.importorskip("sklearn")
    d = load_dataset("digits", limit=50)
    assert (len(d.train), len(d.val), len(d.test)) == (50, 50, 50)


# ---- MNIST -----------------------------------------------------------------------------------


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_from_idx_folder(tmp_path, gz):
    raw = make_mnist(str(tmp_path), gz)
    d = load_dataset(f"mnist:{tmp_path}", val_fraction=0.0)
    assert d.name == "mnist" and d.labels == [str(i) for i in range(10)]
    assert d.input_shape == (1, 28, 28)
    assert d.preprocessing["pixel_max"] == 255
    # the official test set is used as is, in file order
    tx = raw["train_x"][:, None]
    want, mean, std = expected_norm(tx, raw["test_x"][:, None], 255.0)
    np.testing.assert_allclose(d.test.x, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(d.test.y, raw["test_y"])
    np.testing.assert_allclose(d.preprocessing["mean"], mean, rtol=1e-9)
    np.testing.assert_allclose(d.preprocessing["std"], std, rtol=1e-9)
    # train is the whole training file, shuffled
    want_train, _, _ = expected_norm(tx, tx, 255.0)
    np.testing.assert_allclose(sort_rows(d.train.x), sort_rows(want_train.astype(np.float32)), atol=1e-5)


def test_mnist_non_square_and_kaggle_names(tmp_path):
    rng = np.random.default_rng(0)
    write_idx(tmp_path / "train-images.idx3-ubyte", rng.integers(0, 256, (20, 5, 7)))
    write_idx(tmp_path / "train-labels.idx1-ubyte", np.arange(20) % 10)
    write_idx(tmp_path / "t10k-images.idx3-ubyte", rng.integers(0, 256, (4, 5, 7)))
    write_idx(tmp_path / "t10k-labels.idx1-ubyte", [1, 2, 3, 4])
    d = load_dataset(f"mnist:{tmp_path}")
    assert d.input_shape == (1, 5, 7) and d.train.x.shape[1:] == (1, 5, 7)
    assert d.preprocessing["image_size"] == [5, 7]


def test_mnist_validation_split_stratified_and_disjoint(tmp_path):
    raw = make_mnist(str(tmp_path), gz=True, n_train=200)
    d = load_dataset(f"mnist:{tmp_path}", val_fraction=0.1)
    assert len(d.val) == 20 and len(d.train) == 180
    assert np.array_equal(np.bincount(d.val.y, minlength=10), np.full(10, 2))
    both = np.concatenate([d.train.x, d.val.x]).reshape(200, -1)
    assert len({r.tobytes() for r in both}) == 200  # every training image exactly once
    assert raw["train_x"].shape[0] == 200


@pytest.mark.parametrize("case, needle", [
    ("magic", "magic"),
    ("short", "size mismatch"),
    ("long", "size mismatch"),
    ("count", "labels for"),
    ("badgz", "decompress"),
    ("missing", "t10k-labels-idx1-ubyte"),
    ("label", "not a digit"),
])
def test_mnist_bad_files(tmp_path, case, needle):
    make_mnist(str(tmp_path), gz=False)
    img = tmp_path / "train-images-idx3-ubyte"
    lab = tmp_path / "train-labels-idx1-ubyte"
    if case == "magic":
        write_idx(img, np.zeros((40, 28, 28)), magic=0x00000801 + 0x10)
    elif case == "short":
        img.write_bytes(img.read_bytes()[:-5])
    elif case == "long":
        img.write_bytes(img.read_bytes() + b"\0")
    elif case == "count":
        write_idx(lab, np.zeros(39))
    elif case == "badgz":
        data = gzip.compress(img.read_bytes())
        img.unlink()
        (tmp_path / "train-images-idx3-ubyte.gz").write_bytes(data[: len(data) // 2])
    elif case == "missing":
        (tmp_path / "t10k-labels-idx1-ubyte").unlink()
    elif case == "label":
        write_idx(lab, np.full(40, 11))
    with pytest.raises(DataError, match=needle) as e:
        load_dataset(f"mnist:{tmp_path}")
    assert isinstance(e.value, PocketError)
    assert "\n" not in str(e.value)


# ---- downloads (fetch monkeypatched to copy local files) -------------------------------------


def sha(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


@pytest.fixture
def local_mnist(tmp_path, monkeypatch):
    src = tmp_path / "mirror"
    raw = make_mnist(str(src), gz=True)
    monkeypatch.setattr(mnist, "FILES", {b: sha(src / (b + ".gz")) for b in mnist.FILES})
    calls = []

    def fetch(url, dest):
        calls.append(url)
        shutil.copyfile(src / os.path.basename(url), dest)

    monkeypatch.setattr(sources, "_fetch", fetch)
    return raw, calls, tmp_path / "cache"


def test_mnist_download_verifies_and_caches(local_mnist):
    raw, calls, cache = local_mnist
    d = load_dataset("mnist", cache_dir=str(cache))
    assert len(calls) == 4 and all(c.startswith(mnist.MIRRORS[0]) for c in calls)
    np.testing.assert_array_equal(d.test.y, raw["test_y"])
    assert sorted(os.listdir(cache / "mnist")) == sorted(b + ".gz" for b in mnist.FILES)
    load_dataset("mnist", cache_dir=str(cache))
    assert len(calls) == 4  # second load comes from the verified cache


def test_download_uses_env_cache(local_mnist, monkeypatch):
    _, calls, cache = local_mnist
    monkeypatch.setenv("POCKET_CACHE", str(cache / "env"))
    load_dataset("mnist")
    assert os.path.isdir(cache / "env" / "mnist")


def test_download_wrong_sha_rejected_and_partial_removed(local_mnist, monkeypatch):
    _, calls, cache = local_mnist
    files = dict(mnist.FILES)
    files["t10k-images-idx3-ubyte"] = "0" * 64
    monkeypatch.setattr(mnist, "FILES", files)
    with pytest.raises(DataError, match="SHA-256") as e:
        load_dataset("mnist", cache_dir=str(cache))
    assert "mnist:PATH" in str(e.value)
    # both mirrors were tried, nothing of the bad file is left behind
    assert sum("t10k-images" in c for c in calls) == len(mnist.MIRRORS)
    assert not [f for f in os.listdir(cache / "mnist") if f.startswith("t10k-images")]


def test_download_falls_back_to_next_mirror_and_cleans_failed_part(local_mnist, monkeypatch):
    _, calls, cache = local_mnist
    real = sources._fetch

    def flaky(url, dest):
        if url.startswith(mnist.MIRRORS[0]):
            with open(dest, "wb") as f:
                f.write(b"half a file")
            raise OSError("connection reset")
        real(url, dest)

    monkeypatch.setattr(sources, "_fetch", flaky)
    load_dataset("mnist", cache_dir=str(cache))
    assert sum(c.startswith(mnist.MIRRORS[1]) for c in calls) == 4
    assert sorted(os.listdir(cache / "mnist")) == sorted(b + ".gz" for b in mnist.FILES)


def test_download_replaces_corrupt_cached_file(local_mnist):
    _, calls, cache = local_mnist
    (cache / "mnist").mkdir(parents=True)
    (cache / "mnist" / "train-labels-idx1-ubyte.gz").write_bytes(b"garbage")
    load_dataset("mnist", cache_dir=str(cache))
    assert len(calls) == 4


def test_download_all_mirrors_fail(tmp_path, monkeypatch):
    def offline(url, dest):
        raise OSError("network unreachable")

    monkeypatch.setattr(sources, "_fetch", offline)
    with pytest.raises(DataError, match="could not download.*network unreachable"):
        load_dataset("cifar10", cache_dir=str(tmp_path))
    assert os.listdir(tmp_path / "cifar10") == []


def test_published_hashes_are_sha256_hex():
    for h in [*mnist.FILES.values(), cifar.SHA256]:
        assert len(h) == 64 and int(h, 16) >= 0


# ---- CIFAR-10 --------------------------------------------------------------------------------


@pytest.mark.parametrize("form", ["folder", "batches", "archive", "archive_in_folder"])
def test_cifar10_binary(tmp_path, form):
    x, y, xt, yt = make_cifar(str(tmp_path / "src"))
    if form == "folder":
        src = tmp_path / "src"
    elif form == "batches":
        src = tmp_path / "src" / "cifar-10-batches-bin"
    else:
        out = tmp_path / "dl"
        out.mkdir()
        tar_folder(str(tmp_path / "src"), out / "cifar-10-binary.tar.gz")
        src = out / "cifar-10-binary.tar.gz" if form == "archive" else out
    d = load_dataset(f"cifar10:{src}", val_fraction=0.0)
    assert d.labels[0] == "airplane" and d.labels[9] == "truck" and len(d.labels) == 10
    assert d.input_shape == (3, 32, 32) and len(d.train) == 20
    want, mean, std = expected_norm(x, xt, 255.0)
    np.testing.assert_allclose(d.test.x, want, rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(d.test.y, yt)
    np.testing.assert_allclose(d.preprocessing["mean"], mean, rtol=1e-9)
    np.testing.assert_allclose(d.preprocessing["std"], std, rtol=1e-9)
    # record layout: channel 0 of the first test image is its bytes 1..1024
    assert d.preprocessing["channels"] == 3


def test_cifar10_download(tmp_path, monkeypatch):
    x, y, xt, yt = make_cifar(str(tmp_path / "src"))
    archive = tmp_path / "cifar-10-binary.tar.gz"
    tar_folder(str(tmp_path / "src"), archive)
    monkeypatch.setattr(cifar, "SHA256", sha(archive))
    monkeypatch.setattr(sources, "_fetch", lambda url, dest: shutil.copyfile(archive, dest))
    d = load_dataset("cifar10", cache_dir=str(tmp_path / "cache"))
    np.testing.assert_array_equal(d.test.y, yt)
    assert os.listdir(tmp_path / "cache" / "cifar10") == ["cifar-10-binary.tar.gz"]


def test_cifar10_download_wrong_sha(tmp_path, monkeypatch):
    make_cifar(str(tmp_path / "src"))
    archive = tmp_path / "cifar-10-binary.tar.gz"
    tar_folder(str(tmp_path / "src"), archive)
    monkeypatch.setattr(sources, "_fetch", lambda url, dest: shutil.copyfile(archive, dest))
    with pytest.raises(DataError, match="SHA-256"):
        load_dataset("cifar10", cache_dir=str(tmp_path / "cache"))  # real hash != our tiny archive
    assert os.listdir(tmp_path / "cache" / "cifar10") == []


def test_cifar10_truncated_record(tmp_path):
    make_cifar(str(tmp_path))
    p = tmp_path / "cifar-10-batches-bin" / "data_batch_3.bin"
    p.write_bytes(p.read_bytes()[:-100])
    with pytest.raises(DataError, match=r"data_batch_3\.bin.*truncated record"):
        load_dataset(f"cifar10:{tmp_path}")


def test_cifar10_missing_batch(tmp_path):
    make_cifar(str(tmp_path))
    (tmp_path / "cifar-10-batches-bin" / "test_batch.bin").unlink()
    with pytest.raises(DataError, match="test_batch.bin"):
        load_dataset(f"cifar10:{tmp_path}")


def test_cifar10_archive_missing_member_and_corrupt(tmp_path):
    make_cifar(str(tmp_path / "src"))
    (tmp_path / "src" / "cifar-10-batches-bin" / "data_batch_5.bin").unlink()
    archive = tmp_path / "a.tar.gz"
    tar_folder(str(tmp_path / "src"), archive)
    with pytest.raises(DataError, match="lacks data_batch_5.bin"):
        load_dataset(f"cifar10:{archive}")
    data = archive.read_bytes()
    archive.write_bytes(data[: len(data) // 2])
    with pytest.raises(DataError, match="corrupt or truncated"):
        load_dataset(f"cifar10:{archive}")


def test_cifar10_bad_label(tmp_path):
    make_cifar(str(tmp_path))
    p = tmp_path / "cifar-10-batches-bin" / "data_batch_1.bin"
    data = bytearray(p.read_bytes())
    data[0] = 42
    p.write_bytes(bytes(data))
    with pytest.raises(DataError, match="label 42"):
        load_dataset(f"cifar10:{tmp_path}")


# ---- SRC and argument errors -----------------------------------------------------------------


@pytest.mark.parametrize("src, kw, needle", [
    ("imagenet", {}, "unknown dataset source"),
    ("csv", {}, "needs a path"),
    ("digits:/x", {}, "takes no path"),
    ("mnist:/no/such/folder", {}, "not a folder"),
    ("cifar10:/no/such/thing", {}, "no such file"),
    ("digits", {"val_fraction": 1.0}, "val_fraction"),
    ("digits", {"test_fraction": -0.1}, "test_fraction"),
    ("digits", {"limit": 0}, "limit"),
    ("digits", {"task": "segmentation"}, "task"),
    ("digits", {"seed": -1}, "seed"),
])
def test_bad_sources_and_arguments(src, kw, needle):
    with pytest.raises(DataError, match=needle):
        load_dataset(src, **kw)
