"""The SPIR-V modules of a build folder are reflected once per manifest digest and fusec
(runtime/prebuilt.py `checked_modules`); every load still checks every module's sha256, and a
manifest whose digest differs (edited and resealed) is reflected again."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import pytest

from fusec.codegen import manifest as mf
from fusec.codegen import spirv
from fusec.runtime import prebuilt
from fusec.runtime.device import RuntimeFailure
from fusec.runtime.dispatch import Build

SOURCE = Path(__file__).parents[1] / "data" / "generic.fuse"


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from fusec.codegen.build import build_source, write_build

    out = tmp_path_factory.mktemp("memo") / "build"
    write_build(build_source(SOURCE.read_text(), str(SOURCE), regions=("proj", "mva")), out)
    return out


def _counting_reflect(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    calls: list[int] = []
    real = spirv.reflect

    def counted(data: bytes) -> Any:
        calls.append(1)
        return real(data)

    monkeypatch.setattr(spirv, "reflect", counted)
    return calls


def _copy(folder: Path, dest: Path) -> Path:
    shutil.copytree(folder, dest)
    for p in dest.iterdir():
        p.chmod(0o644)
    return dest


@pytest.mark.shaderc
def test_modules_are_reflected_once_per_digest(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    calls = _counting_reflect(monkeypatch)
    first = Build.load(folder)
    n = len(calls)
    assert n == sum(len(list(r.kernels())) for r in first.manifest.regions) > 1
    second = Build.load(folder)
    assert len(calls) == n  # passed before: sha256s only
    names = [k.name for r in first.manifest.regions for k in r.kernels()]
    assert [second.spv(k) for r in second.manifest.regions for k in r.kernels()] == [
        first.spv(k) for r in first.manifest.regions for k in r.kernels()
    ] and len(names) == n
    # another fusec (the checking code's key) reflects again
    monkeypatch.setattr(prebuilt, "_module_check_key", lambda: "another-checker")
    Build.load(folder)
    assert len(calls) == 2 * n


@pytest.mark.shaderc
def test_a_memo_never_passes_changed_bytes_or_a_resealed_manifest(
    folder: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    Build.load(folder)  # remembered
    calls = _counting_reflect(monkeypatch)
    # one bit of a module flipped: its sha256 no longer matches, memo or not
    bad = _copy(folder, tmp_path / "flipped")
    spv = sorted(bad.glob("*.spv"))[-1]
    raw = bytearray(spv.read_bytes())
    raw[-3] ^= 0x10
    spv.write_bytes(bytes(raw))
    with pytest.raises(RuntimeFailure, match=f"{spv.name} does not have the sha256"):
        Build.load(bad)
    # a manifest edited to declare another workgroup size, sealed again: a new digest, so the
    # modules are reflected and the one that disagrees is refused
    edited = _copy(folder, tmp_path / "resealed")
    data = json.loads((edited / "manifest.json").read_text())
    kernel = data["regions"][0]["fused"][0]
    kernel["workgroup_size"] *= 2
    (edited / "manifest.json").write_text(json.dumps(mf.seal(data), indent=1))
    with pytest.raises(RuntimeFailure, match="declares workgroup size"):
        Build.load(edited)
    assert calls  # reflected, not skipped
