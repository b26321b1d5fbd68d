"""One front end (issue 19): `check DIR` checks a folder's source with the options its build
recorded, and `check FILE --region R` / `occupancy FILE --region R` compile only R's kernels."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from tests.conftest import ROOT, fusec_cli

# a shared stage of K floats: 56,000 bytes at K = 14000, more than the smallest target's 49,152
# bytes of shared memory, less than gfx1201's 65,536
SHARED = """\
region big(x: f32[K], g: f32[K], W: f16[N, K]) -> y: f32[N]
    const K = 14000 in 1 .. 14000, N = 64 in 1 .. 4096, eps = 1e-6
    launch workgroup 256
    ss = sum(k: x[k] * x[k]) @ workgroup in shared
    xn[k] = x[k] * rsqrt(ss / K + eps) * g[k] in shared
    y[n] = sum(k: W[n, k] * xn[k]) @ subgroup

region small(x: f32[N], g: f32[N]) -> y: f32[N]
    const N = 4096 in 1 .. 1048576
    launch workgroup 256
    y[n] = x[n] * g[n]
"""


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_check_folder_uses_the_builds_targets(tmp_path: Path) -> None:
    (tmp_path / "big.fuse").write_text(SHARED)
    everywhere = fusec_cli(
        ["build", "big.fuse", "-o", "all"], capture_output=True, text=True, cwd=tmp_path
    )
    assert everywhere.returncode == 1 and "56000 bytes" in everywhere.stderr, everywhere.stderr
    built = fusec_cli(
        ["build", "big.fuse", "--target", "gfx1201", "-o", "b2"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    assert built.returncode == 0, built.stderr
    options = json.loads((tmp_path / "b2" / "manifest.json").read_text())["build_options"]
    assert options == {"targets": ["gfx1201"], "regions": []}
    checked = fusec_cli(
        ["check", "b2", "--region", "small", "--seed", "3"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
    )
    # the folder's source is checked with gfx1201's limit, as it was built: no refusal of 'big'
    assert checked.returncode == 0, checked.stderr
    assert "small [" in checked.stdout and "ok" in checked.stdout, checked.stdout


def _compiled_regions(monkeypatch: pytest.MonkeyPatch, args: list[str]) -> tuple[int, list[str]]:
    """(kernels compiled, regions in the manifest) of one in-process `fusec` command run on
    kernels.fuse with an empty object cache."""
    import fusec.codegen.build as build
    from fusec.runtime import cli

    compiled: list[str] = []
    real = build.compile_glsl

    def counting(text: str, name: str, *rest: object, **kw: object) -> bytes:
        compiled.append(name)
        return real(text, name, *rest, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(build, "compile_glsl", counting)
    monkeypatch.setattr(build, "OBJECT_CACHE", False)
    loaded: list[list[str]] = []
    real_load = cli._cached

    def recording(*a: object, **kw: object) -> tuple[object, object]:
        b, result = real_load(*a, **kw)  # type: ignore[arg-type]
        loaded.append([r.name for r in b.manifest.regions])
        return b, result

    monkeypatch.setattr(cli, "_cached", recording)
    assert cli.main(args) == 0
    return len(compiled), loaded[0]


@pytest.mark.shaderc
def test_occupancy_region_compiles_only_that_region(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(ROOT)
    n, regions = _compiled_regions(
        monkeypatch,
        ["occupancy", "kernels.fuse", "--region", "add_rms_norm", "--target", "gfx1201", "--json"],
    )
    rows = json.loads(capsys.readouterr().out)
    assert regions == ["add_rms_norm"]
    assert {r["region"] for r in rows} == {"add_rms_norm"}
    kernels = {r["kernel"] for r in rows}
    # every kernel of the region, each compiled at most once, and nothing else
    assert {"fused", "unfused.0"} <= kernels, kernels
    assert 0 < n <= len(kernels), (n, kernels)


@pytest.mark.shaderc
@pytest.mark.vulkan
def test_check_region_compiles_only_that_region(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("FUSEC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.chdir(ROOT)
    n, regions = _compiled_regions(
        monkeypatch, ["check", "kernels.fuse", "--region", "add_rms_norm", "--seed", "5"]
    )
    out = capsys.readouterr().out
    assert regions == ["add_rms_norm"]
    assert "add_rms_norm [" in out and "MISMATCH" not in out, out
    # add_rms_norm's fused kernel and its unfused chain: a handful, not the file's 150-odd
    assert 1 < n <= 8, n


def test_unknown_region_is_one_diagnostic(tmp_path: Path) -> None:
    (tmp_path / "s.fuse").write_text(SHARED)
    proc = fusec_cli(
        ["occupancy", "s.fuse", "--region", "nope", "--target", "gfx1201"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env={**os.environ, "FUSEC_CACHE_DIR": str(tmp_path / "c")},
    )
    assert proc.returncode == 1
    assert "no region 'nope'" in proc.stderr and "regions: big, small" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_a_missing_dependency_is_one_sentence_not_an_internal_error(tmp_path: Path) -> None:
    """fusec run by a Python that lacks one of its packages (another interpreter than the one
    it was installed into) says which package, in one sentence with a hint, and exits 1."""
    import subprocess
    import sys

    missing = "lark"  # imported only once a command parses a source
    src = tmp_path / "s.fuse"
    src.write_text((ROOT / "tests" / "data" / "scale.fuse").read_text())
    code = (
        "import sys\n"
        "from fusec.runtime.cli import main\n"
        f"sys.modules[{missing!r}] = None  # `import {missing}` now fails as if not installed\n"
        f"sys.exit(main(['check', {str(src)!r}]))\n"
    )
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=tmp_path
    )
    assert proc.returncode == 1, proc.stderr
    assert proc.stderr.startswith(f"fusec: error: the Python package '{missing}' is not installed")
    assert "hint:" in proc.stderr and "internal error" not in proc.stderr
    assert "Traceback" not in proc.stderr
