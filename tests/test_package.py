"""fusec as an installable package: one `fusec` namespace (fusec.dsl, fusec.codegen,
fusec.runtime), `python -m fusec`, and a wheel built by `pip wheel` that installs into a fresh
virtual environment and runs `fusec demo` outside the checkout, with nothing of the checkout on
its path and no top-level `dsl`, `codegen`, `runtime` or `examples` module."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# a source of the test's own, small enough for lavapipe in seconds; both regions fuse
SOURCE = """\
region add_rms_norm(a: f32[K], b: f32[K], g: f32[K]) -> (h: f32[K], out: f32[K])
    const K = 1536 in 1 .. 1048576, eps = 1e-6
    launch workgroup 128, subgroup any
    hh[k]  = a[k] + b[k]
    ss     = sum(k: hh[k] * hh[k]) @ workgroup          in shared
    h[k]   = hh[k]
    out[k] = hh[k] * rsqrt(ss / K + eps) * g[k]

region norm_matvec(x: f32[K], g: f32[K], W: f16[N, K]) -> y: f32[N]
    const K = 768 in 1 .. 8192, N = 96 in 1 .. 65536, eps = 1e-6
    launch workgroup 128, subgroup any
    ss   = sum(k: x[k] * x[k]) @ workgroup              in shared
    xn[k] = x[k] * rsqrt(ss / K + eps) * g[k]           in shared
    y[n] = sum(k: W[n, k] * xn[k])                      layout n -> subgroup, k -> lane
"""


def _clean_env() -> dict[str, str]:
    """The environment without anything that would put the checkout on Python's path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.pop("VIRTUAL_ENV", None)
    return env


def _run(
    cmd: list[str | Path], cwd: Path, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(c) for c in cmd],
        cwd=cwd,
        env=_clean_env(),
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def test_the_packages_map_the_top_level_folders() -> None:
    """pyproject.toml installs each top-level folder under `fusec.`, and the links in fusec/ that
    a checkout imports through point at the same folders: the two views cannot drift."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    mapping = config["package-dir"]
    assert (
        set(config["packages"])
        == set(mapping)
        == {
            "fusec",
            "fusec.dsl",
            "fusec.codegen",
            "fusec.runtime",
        }
    )
    for package, folder in mapping.items():
        if package == "fusec":
            continue
        link = ROOT / "fusec" / package.split(".")[1]
        assert link.is_symlink() and link.resolve() == (ROOT / folder).resolve(), link
        assert (ROOT / folder / "__init__.py").is_file(), folder
    assert config["package-data"]["fusec.dsl"] == ["*.lark"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts == {"fusec": "fusec.runtime.cli:main"}


def test_python_m_fusec_is_the_cli() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "fusec", "--help"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "usage: fusec" in proc.stdout and "build" in proc.stdout


def _copy_sources(dest: Path) -> Path:
    """The files a wheel is built from, copied so that the build leaves the checkout alone."""
    src = dest / "src"
    src.mkdir()
    for name in ("pyproject.toml", "setup.py", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    skip = shutil.ignore_patterns("__pycache__", "*.so", "*.c", "*.o")
    for folder in ("dsl", "codegen", "runtime"):
        shutil.copytree(ROOT / folder, src / folder, ignore=skip)
    shutil.copytree(ROOT / "fusec", src / "fusec", symlinks=True, ignore=skip)
    return src


@pytest.mark.slow
@pytest.mark.shaderc
@pytest.mark.vulkan
def test_a_wheel_installs_in_a_fresh_venv_and_runs_the_demo_outside_the_checkout(
    tmp_path: Path,
) -> None:
    src = _copy_sources(tmp_path)
    wheels = tmp_path / "wheels"
    proc = _run([sys.executable, "-m", "pip", "wheel", ".", "--no-deps", "-q", "-w", wheels], src)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = wheels.glob("fusec-*.whl")
    with zipfile.ZipFile(wheel) as z:
        tops = {name.split("/")[0] for name in z.namelist()}
        names = set(z.namelist())
    assert tops - {"fusec"} == {f"fusec-{wheel.name.split('-')[1]}.dist-info"}
    assert {"fusec/dsl/fuse.lark", "fusec/codegen/manifest.schema.json"} <= names
    assert "fusec/runtime/decode_layer.py" in names  # `fusec bench` needs no examples/

    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    py, fusec = env_dir / "bin" / "python", env_dir / "bin" / "fusec"
    proc = _run([py, "-m", "pip", "install", "-q", wheel], tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]

    work = tmp_path / "work"
    work.mkdir()
    (work / "ops.fuse").write_text(SOURCE)
    proc = _run([fusec, "demo", "ops.fuse"], work)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    assert "every region verified" in proc.stdout
    assert "2 regions" in proc.stdout
    assert (work / "build" / "manifest.json").is_file()

    probe = (
        "import importlib.util as u, fusec, fusec.runtime.cli as c; "
        "print(fusec.__file__); print(c.__file__); "
        "print([m for m in ('dsl', 'codegen', 'runtime', 'examples', '_fusec_shaderc') "
        "if u.find_spec(m)])"
    )
    proc = _run([py, "-c", probe], work)
    assert proc.returncode == 0, proc.stderr
    fusec_file, cli_file, leaked = proc.stdout.splitlines()
    assert str(env_dir) in fusec_file and str(env_dir) in cli_file
    assert str(ROOT) not in fusec_file + cli_file
    assert leaked == "[]"
    proc = _run([py, "-c", "import dsl"], work)
    assert proc.returncode != 0 and "No module named 'dsl'" in proc.stderr
    proc = _run([py, "-m", "fusec", "check", "ops.fuse", "--region", "add_rms_norm"], work)
    assert proc.returncode == 0, proc.stderr[-2000:]
