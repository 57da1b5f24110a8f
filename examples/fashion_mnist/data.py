"""Fashion-MNIST from IDX files (as Debian's dataset-fashion-mnist ships them, gzipped,
or plain), checked before use: a wrong, truncated or corrupt file is named with what is
wrong, instead of surfacing later as a reshape error or a silently wrong model.

IDX format: a 4-byte magic number (two zero bytes, a type code — 0x08 for unsigned
bytes — and the number of dimensions), then each dimension as a big-endian uint32, then
the data in C order.
"""

from __future__ import annotations

import gzip
import os
import struct
from dataclasses import dataclass
from pathlib import Path

import numpy as np

DEBIAN_DIR = Path("/usr/share/datasets/fashion-mnist")
FILES = {
    "train_images": "train-images-idx3-ubyte",
    "train_labels": "train-labels-idx1-ubyte",
    "test_images": "t10k-images-idx3-ubyte",
    "test_labels": "t10k-labels-idx1-ubyte",
}
CLASSES = ("T-shirt/top", "Trouser", "Pullover", "Dress", "Coat",
           "Sandal", "Shirt", "Sneaker", "Bag", "Ankle boot")  # fmt: skip
_UBYTE = 0x08


class DatasetError(Exception):
    """The data is missing or not what Fashion-MNIST's IDX files must be."""


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """An IDX file of unsigned bytes with `ndim` dimensions (gzipped or not)."""
    try:
        with open(path, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise DatasetError(f"cannot read {path}: {exc.strerror}") from None
    if raw[:2] == b"\x1f\x8b":
        try:
            raw = gzip.decompress(raw)
        except (OSError, EOFError) as exc:
            raise DatasetError(f"{path}: corrupt gzip data ({exc})") from None
    if len(raw) < 4:
        raise DatasetError(f"{path}: {len(raw)} bytes, too short for an IDX header")
    zero, dtype, dims = struct.unpack(">HBB", raw[:4])
    magic = int.from_bytes(raw[:4], "big")
    if zero != 0 or dtype != _UBYTE or dims != ndim:
        want = (_UBYTE << 8) | ndim
        raise DatasetError(
            f"{path}: magic number 0x{magic:08x}, expected 0x{want:08x} "
            f"(unsigned bytes, {ndim} dimension{'s' if ndim > 1 else ''}); not this IDX file"
        )
    header = 4 + 4 * ndim
    if len(raw) < header:
        raise DatasetError(f"{path}: header truncated ({len(raw)} of {header} bytes)")
    shape = struct.unpack(f">{ndim}I", raw[4:header])
    expected = int(np.prod(shape, dtype=np.int64))
    if len(raw) - header != expected:
        raise DatasetError(
            f"{path}: shape {shape} needs {expected} data bytes, found {len(raw) - header}"
        )
    return np.frombuffer(raw, dtype=np.uint8, offset=header).reshape(shape)


def _find(directory: Path, stem: str) -> Path:
    for name in (stem, stem + ".gz"):
        if (directory / name).is_file():
            return directory / name
    raise DatasetError(f"{directory}: no {stem} or {stem}.gz")


@dataclass(frozen=True)
class FashionMNIST:
    train_images: np.ndarray  # (N, 28, 28) uint8
    train_labels: np.ndarray  # (N,) uint8, 0..9
    test_images: np.ndarray
    test_labels: np.ndarray


def default_dir() -> Path:
    return Path(os.environ.get("FASHION_MNIST_DIR", DEBIAN_DIR))


def load(directory: str | Path | None = None) -> FashionMNIST:
    """The four files from `directory` (default: $FASHION_MNIST_DIR or Debian's
    /usr/share/datasets/fashion-mnist), validated: shapes, counts and label range."""
    d = Path(directory) if directory is not None else default_dir()
    if not d.is_dir():
        hint = (" (install Debian's package: apt-get install dataset-fashion-mnist)"
                if d == DEBIAN_DIR else "")  # fmt: skip
        raise DatasetError(f"no dataset directory {d}{hint}")
    arrays = {}
    for key, stem in FILES.items():
        arrays[key] = read_idx(_find(d, stem), 3 if key.endswith("images") else 1)
    for split in ("train", "test"):
        images, labels = arrays[f"{split}_images"], arrays[f"{split}_labels"]
        if images.shape[1:] != (28, 28):
            raise DatasetError(f"{split} images are {images.shape[1:]}, expected 28 x 28")
        if len(images) != len(labels):
            raise DatasetError(
                f"{split}: {len(images)} images but {len(labels)} labels; files do not match"
            )
        if labels.size and labels.max() > 9:
            raise DatasetError(f"{split} labels go up to {labels.max()}; expected 0..9")
    return FashionMNIST(**arrays)


def write_idx(path: Path, array: np.ndarray, compress: bool = False) -> None:
    """Write `array` (uint8) as an IDX file: for tests and for small custom datasets."""
    a = np.ascontiguousarray(array, dtype=np.uint8)
    raw = struct.pack(">HBB", 0, _UBYTE, a.ndim) + struct.pack(f">{a.ndim}I", *a.shape)
    raw += a.tobytes()
    Path(path).write_bytes(gzip.compress(raw) if compress else raw)


def shard(n: int, index: int, count: int) -> slice:
    """Worker `index` of `count`'s contiguous share of n examples (sizes differ by <= 1)."""
    base, extra = divmod(n, count)
    start = index * base + min(index, extra)
    return slice(start, start + base + (1 if index < extra else 0))


def to_float(images: np.ndarray) -> np.ndarray:
    """uint8 (N, 28, 28) -> float32 (N, 1, 28, 28), scaled to [0, 1]."""
    return (images.astype(np.float32) / 255.0)[:, None]
