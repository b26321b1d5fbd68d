"""runtime/persistent_aot.py: the persistent products a build folder holds are checked as
strictly as its manifest before one runs.  A damaged persistent/index.json (not JSON, a wrong
shape, a missing, extra or mistyped key, an entry that disagrees with the product) or a damaged
product file (another sha256, missing, a link, unlisted, declarations that are not the
product's) is refused in one sentence, never a traceback; a build over a damaged index
compiles again what the index no longer vouches for."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.codegen import persistent as pc
from fusec.runtime import decode_layer as layer
from fusec.runtime import persistent as rp
from fusec.runtime import persistent_aot as aot
from fusec.runtime.device import RuntimeFailure
from fusec.runtime.dispatch import Build
from fusec.runtime.step import StepBuffers, step_buffers

TINY = layer.PRESETS["tiny"]
SIZE = 8  # lavapipe's default subgroup size here; any of GENERIC_SUBGROUPS would do


@pytest.fixture(scope="module")
def products(kernels_folder: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the session's build with the tiny f16 product at subgroup size SIZE."""
    folder = tmp_path_factory.mktemp("index") / "build"
    shutil.copytree(kernels_folder, folder)
    aot.build_products(folder, ["tiny"], ["f16"], [None], [SIZE])
    return folder


def _product(folder: Path) -> pc.Product:
    build = Build.load(folder)
    calls = layer.calls(TINY, "f16", regions=build.manifest)
    return pc.plan_product(aot.product_specs(build, calls, rp.source_program()), SIZE)


def _index(folder: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((folder / aot.PRODUCTS / aot.INDEX).read_text())
    return data


def _write_index(folder: Path, data: Any) -> None:
    (folder / aot.PRODUCTS / aot.INDEX).write_text(json.dumps(data))


def _entry(edit: Callable[[dict[str, Any]], None]) -> Callable[[Path, str], None]:
    def damage(folder: Path, key: str) -> None:
        data = _index(folder)
        edit(data[key])
        _write_index(folder, data)

    return damage


def _spv(folder: Path, key: str) -> Path:
    return folder / aot.PRODUCTS / f"{key}.spv"


def _flip_a_byte(folder: Path, key: str) -> None:
    raw = bytearray(_spv(folder, key).read_bytes())
    raw[len(raw) // 2] ^= 0x10
    _spv(folder, key).write_bytes(bytes(raw))


def _another_module_resealed(folder: Path, key: str) -> None:
    """A kernel of the build (its own workgroup size and bindings) under the product's name,
    the index's sha256 recomputed: the digest passes, the declarations do not."""
    other = next(p for p in sorted(folder.glob("*.spv")) if "matvec_add" in p.name)
    _spv(folder, key).write_bytes(other.read_bytes())
    data = _index(folder)
    data[key]["sha256"] = hashlib.sha256(other.read_bytes()).hexdigest()
    _write_index(folder, data)


def _linked(folder: Path, key: str) -> None:
    real = folder / "elsewhere.spv"
    shutil.move(_spv(folder, key), real)
    os.symlink(real, _spv(folder, key))


DAMAGES: dict[str, tuple[Callable[[Path, str], None], str]] = {
    "not json": (lambda f, k: (f / aot.PRODUCTS / aot.INDEX).write_text("{"), "is not valid JSON"),
    "nan": (
        lambda f, k: (f / aot.PRODUCTS / aot.INDEX).write_text('{"a": NaN}'),
        "NaN is not a JSON number",
    ),
    "a list": (lambda f, k: _write_index(f, [1]), "is not an object of products by key"),
    "a bad key": (
        lambda f, k: _write_index(f, {**_index(f), "../x": {}}),
        "which is no product key",
    ),
    "no sha256": (_entry(lambda e: e.pop("sha256")), "does not hold exactly"),
    "an extra key": (_entry(lambda e: e.update(run="yes")), "does not hold exactly"),
    "items a string": (_entry(lambda e: e.update(items="552")), "items of"),
    "items negative": (_entry(lambda e: e.update(items=-1)), "items of"),
    "another key": (_entry(lambda e: e.update(key="0" * 64)), "names another key"),
    "items wrong": (_entry(lambda e: e.update(items=e["items"] + 1)), "the product of that key"),
    "sha256 wrong": (_entry(lambda e: e.update(sha256="0" * 64)), "does not have the sha256"),
    "a byte flipped": (_flip_a_byte, "does not have the sha256"),
    "file missing": (lambda f, k: _spv(f, k).unlink(), "is missing"),
    "file unlisted": (lambda f, k: _write_index(f, {}), "is not in persistent/index.json"),
    "file a link": (_linked, "cannot open persistent/"),
    "index a directory": (
        lambda f, k: (
            (f / aot.PRODUCTS / aot.INDEX).unlink(),
            (f / aot.PRODUCTS / aot.INDEX).mkdir(),
        ),
        "persistent/index.json is not a regular file",
    ),
    "another module": (_another_module_resealed, "declares workgroup size"),
    "stamps flipped": (
        _entry(lambda e: e.update(stamps=not e["stamps"])),
        "is a product with stamps; the product of that key is a product without stamps",
    ),
    "stamps a number": (_entry(lambda e: e.update(stamps=1)), "stamps of"),
}


@pytest.mark.shaderc
def test_the_index_records_each_file(products: Path) -> None:
    product = _product(products)
    key = aot.product_key(product)
    index = aot.read_index(products)
    assert set(index) == {key}
    entry = index[key]
    assert (entry.preset, entry.weights, entry.target, entry.subgroup) == (
        "tiny",
        "f16",
        None,
        SIZE,
    )
    assert entry.items == product.items > 1 and entry.workgroup_size == product.workgroup_size
    assert entry.stamps is False  # built without --stamps
    spv = aot.find_spv(products, product)
    assert spv is not None and hashlib.sha256(spv).hexdigest() == entry.sha256
    # a product the build has no file of (another subgroup size) is not found, not refused
    other = pc.plan_product(
        aot.product_specs(
            Build.load(products),
            layer.calls(TINY, "f16", regions=Build.load(products).manifest),
            rp.source_program(),
        ),
        16,
    )
    assert aot.find_spv(products, other) is None


@pytest.mark.shaderc
@pytest.mark.parametrize("damage", sorted(DAMAGES))
def test_a_damaged_product_is_refused_in_one_sentence(
    products: Path, tmp_path: Path, damage: str
) -> None:
    folder = tmp_path / "build"
    shutil.copytree(products, folder, symlinks=True)
    product = _product(folder)
    edit, words = DAMAGES[damage]
    edit(folder, aot.product_key(product))
    with pytest.raises(RuntimeFailure) as caught:
        aot.find_spv(folder, product)
    text = str(caught.value)
    assert words in text, text
    assert "damaged" in text and "\n" not in text.split("hint")[0].strip(), text


@pytest.mark.shaderc
def test_a_build_over_a_damaged_index_compiles_again(products: Path, tmp_path: Path) -> None:
    folder = tmp_path / "build"
    shutil.copytree(products, folder)
    product = _product(folder)
    key = aot.product_key(product)
    good = _spv(folder, key).read_bytes()
    _flip_a_byte(folder, key)
    (folder / aot.PRODUCTS / aot.INDEX).write_text("{")  # vouches for nothing
    built = aot.build_products(folder, ["tiny"], ["f16"], [None], [SIZE])
    assert [b.key for b in built] == [key]
    assert _spv(folder, key).read_bytes() == good  # compiled again: the same bytes
    assert aot.find_spv(folder, product) == good
    # a file the index does not vouch for (its sha256 differs) is compiled again too
    _flip_a_byte(folder, key)
    aot.build_products(folder, ["tiny"], ["f16"], [None], [SIZE])
    assert aot.find_spv(folder, product) == good


@pytest.mark.vulkan
@pytest.mark.shaderc
def test_the_runtime_refuses_a_damaged_product(products: Path, tmp_path: Path, dev: Any) -> None:
    """FUSEC_PERSISTENT=on over a folder whose product was tampered with: one sentence."""
    if dev.info.subgroup_size != SIZE:
        pytest.skip(f"the products here are built for subgroup size {SIZE}")
    folder = tmp_path / "build"
    shutil.copytree(products, folder)
    _flip_a_byte(folder, aot.product_key(_product(folder)))
    build = Build.load(folder)
    calls = layer.calls(TINY, "f16", regions=build.manifest)
    bufs = StepBuffers(dev, step_buffers(build, calls))
    try:
        bufs.upload(layer.random_state(TINY, "f16", np.random.default_rng()))
        with pytest.raises(RuntimeFailure, match="does not have the sha256"):
            rp.persistent_or_chain(dev, build, calls, bufs, rp.source_program(), "on")
    finally:
        bufs.destroy()
