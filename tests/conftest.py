"""Shared fixtures: repository root, tier detection (shaderc, vulkan), kernels.fuse built once
per session, `--update-golden`, and the kernel-IR validator run after every lowering."""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent

# lavapipe compiles each pipeline with LLVM, and compiling is most of the suite's time (the tiny
# decode layer's products at subgroup size 16: 140 s cold, 2 s with a warm shader cache).
# Mesa's GALLIVM_PERF=nopt ("disable optimization passes to speed up shader compilation", in
# the gallivm debug options of Mesa's llvmpipe) skips LLVM's optimization passes, not its code
# generation: the same results, slower kernels, for a suite that checks results and never times
# lavapipe.  Inherited by the suite's child processes; set GALLIVM_PERF yourself to override.
os.environ.setdefault("GALLIVM_PERF", "nopt")


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption(
        "--update-golden",
        action="store_true",
        default=False,
        help="rewrite tests/golden/ from kernels.fuse instead of comparing (review the diff)",
    )


# every lowering entry point, and the modules that import it by name
_LOWERINGS = {
    "fusec.codegen.lower": ("lower_fused", "lower_unfused"),
    "fusec.codegen.lower_tile": ("lower_tile_fused", "lower_tile_unfused"),
}
_IMPORTERS = ("fusec.codegen.build", "fusec.codegen.dump")
_patches = pytest.MonkeyPatch()


def _validated(lowering: Callable[..., Any]) -> Callable[..., Any]:
    from fusec.codegen.validate import validate_kernels

    @functools.wraps(lowering)
    def lower_and_validate(*args: Any, **kwargs: Any) -> Any:
        kernels = lowering(*args, **kwargs)
        validate_kernels(kernels)
        return kernels

    return lower_and_validate


def pytest_configure(config: pytest.Config) -> None:
    """Every lowering in the test process validates its kernels (codegen/validate.py): an
    invalid kernel fails the test that lowered it with an AssertionError.  Patched before the
    test modules are imported, so that their `from fusec.codegen.lower import lower_fused` gets the
    validating one too (child processes, e.g. `fusec` run by a test, do not validate)."""
    import importlib

    for module_name, names in _LOWERINGS.items():
        module = importlib.import_module(module_name)
        for name in names:
            original = getattr(module, name)
            wrapped = _validated(original)
            _patches.setattr(module, name, wrapped)
            for importer in _IMPORTERS:
                other = importlib.import_module(importer)
                if getattr(other, name, None) is original:
                    _patches.setattr(other, name, wrapped)


def pytest_unconfigure(config: pytest.Config) -> None:
    _patches.undo()


@functools.cache
def has_compiler() -> bool:
    from fusec.codegen.shaderc import backend

    return backend() != "none"


@functools.cache
def vulkan_device_name() -> str | None:
    from fusec.runtime.device import Device, RuntimeFailure

    try:
        with Device() as dev:
            return dev.info.name
    except RuntimeFailure:
        return None


# TODO(issue 19): slow tests in files other people are editing now; move these into the files
# as `@pytest.mark.slow` when they are committed, then delete this table
SLOW_ELSEWHERE = {
    "tests/estimator/test_corpus.py": {
        "test_corpus_against_aco",
        "test_every_generated_region_builds",
    },
    "tests/estimator/test_scheduler_probe.py": {"test_probe_ends_at_the_scheduler_bound"},
    "tests/codegen/test_estimate.py": {
        "test_estimates_match_aco_for_kernels_fuse",
        "test_contraction_model_beyond_kernels_fuse",
    },
}


# the files that take minutes on CI's two cores, longest first: they are collected (and so handed
# to `make test`'s workers, --dist loadfile) before every other file, so that the workers end
# together instead of one running a long file alone at the end (measured 2026-12-02: 1748 s of
# wall time for 3243 s of tests, two workers)
FIRST = (
    "tests/estimator/test_corpus.py",
    "tests/runtime/test_check.py",
    "tests/codegen/test_q8_0x.py",
    "tests/runtime/test_tune.py",
    "tests/runtime/test_persistent_stamps.py",
    "tests/runtime/test_persistent.py",
    "tests/test_package.py",
)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    rank = {name: i for i, name in enumerate(FIRST)}
    items.sort(key=lambda item: rank.get(item.path.relative_to(ROOT).as_posix(), len(FIRST)))
    for item in items:
        where = item.path.relative_to(ROOT).as_posix()
        if getattr(item, "originalname", item.name) in SLOW_ELSEWHERE.get(where, ()):
            item.add_marker(pytest.mark.slow)
        if "shaderc" in item.keywords and not has_compiler():
            item.add_marker(pytest.mark.skip(reason="no shaderc extension and no glslc"))
        if "vulkan" in item.keywords and vulkan_device_name() is None:
            item.add_marker(pytest.mark.skip(reason="no Vulkan device (install lavapipe)"))


@pytest.fixture(scope="session", autouse=True)
def _build_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`occupancy` and `check FILE` build into a cache folder: the suite's own, never the
    user's ~/.cache (child processes inherit it).  Under pytest-xdist the workers of one run
    share it (the object cache takes concurrent builds, as two `fusec build`s of a user do), so
    a kernel one worker compiled is not compiled again by the other."""
    import os

    if os.environ.get("PYTEST_XDIST_WORKER"):
        cache = tmp_path_factory.getbasetemp().parent / "fusec-cache"
        cache.mkdir(exist_ok=True)
    else:
        cache = tmp_path_factory.mktemp("fusec-cache")
    old = os.environ.get("FUSEC_CACHE_DIR")
    os.environ["FUSEC_CACHE_DIR"] = str(cache)
    yield cache
    if old is None:
        del os.environ["FUSEC_CACHE_DIR"]
    else:
        os.environ["FUSEC_CACHE_DIR"] = old


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(ROOT)
    return ROOT


@pytest.fixture(scope="session")
def _kernels(tmp_path_factory: pytest.TempPathFactory, _build_cache: Path) -> tuple[Any, Path]:
    """kernels.fuse built once per process.  Under pytest-xdist the workers build it one at a
    time (a lock file beside the shared cache): the first compiles it, the next finds every
    kernel in the cache (3 s instead of 18), where two workers starting together compiled the
    same kernels side by side, 40 s each on two cores."""
    import fcntl

    from fusec.codegen.build import build_source, write_build

    with open(_build_cache.parent / "kernels-build.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        result = build_source((ROOT / "kernels.fuse").read_text(), "kernels.fuse")
    out = write_build(result, tmp_path_factory.mktemp("kernels") / "build")
    return result, out


@pytest.fixture(scope="session")
def kernels_build(_kernels: tuple[Any, Path]) -> Any:
    """kernels.fuse built once for the session: its `BuildResult` (`build_source`), also written
    to `kernels_folder`.  Read it, never change it: other tests share it."""
    return _kernels[0]


@pytest.fixture(scope="session")
def kernels_folder(_kernels: tuple[Any, Path]) -> Path:
    """The build folder of the session's kernels.fuse (SPIR-V, glsl/, manifest.json).  Read
    it, never change it: a test that edits a build copies the folder first."""
    return _kernels[1]


@pytest.fixture(scope="session")
def build(kernels_folder: Path) -> Any:
    """The session's kernels.fuse build, loaded (a test module may define its own `build`)."""
    from fusec.runtime.dispatch import Build

    return Build.load(kernels_folder)


@pytest.fixture(scope="session")
def dev() -> Iterator[Any]:
    """The default Vulkan device, opened once for the session."""
    from fusec.runtime.device import Device

    with Device() as d:
        yield d


def skip_unless_lavapipe() -> None:
    """Skip a test that needs lavapipe where FUSEC_DEVICE selects another device."""
    if "llvmpipe" not in (os.environ.get("FUSEC_DEVICE") or "llvmpipe"):
        pytest.skip("FUSEC_DEVICE selects a device other than lavapipe")


# lavapipe's subgroup sizes: LP_NATIVE_VECTOR_WIDTH (bits) / 32 lanes
LAVAPIPE_SIZES = ((128, 4), (256, 8), (512, 16))
WIDE_WIDTH = 512
# one name in this many of each kind runs at 16 lanes (rotated_sizes)
WIDE_SHARE = 4


def rotated_sizes(kinds: Mapping[str, Sequence[str]]) -> dict[str, frozenset[int]]:
    """Two of lavapipe's three subgroup sizes (4, 8, 16) for each name of `kinds` (kind ->
    names).  16 lanes are 512-bit vectors, which lavapipe's LLVM compiles 5 to 6 times slower
    than 8 lanes (a region of kernels.fuse: 2 to 75 s, shader cache off), so they go to one
    name in WIDE_SHARE of each kind (at least one), which runs at 4 or 8 lanes besides (in
    turn); every other name runs at 4 and 8.  Within a kind the names go in the order of a
    stable hash (CRC-32, never the salted `hash()`), starting at the kind's own: the same names
    run at the same sizes in every run; every name runs at 4 or 16 lanes (lavapipe's default is
    8 on AVX2) and at one more; and every kind of two or more names runs at every size."""
    import zlib

    def crc(text: str) -> int:
        return zlib.crc32(text.encode())

    out: dict[str, frozenset[int]] = {}
    for kind, names in kinds.items():
        order = sorted(names, key=lambda n: (crc(n), n))
        start = crc(kind) % max(1, len(order))
        order = order[start:] + order[:start]
        wide = max(1, round(len(order) / WIDE_SHARE))
        for i, name in enumerate(order):
            out[name] = frozenset((16, (4, 8)[i % 2]) if i < wide else (4, 8))
    return out


def at_size(sizes: Mapping[str, frozenset[int]], subgroup: int) -> list[str]:
    """The names `rotated_sizes` runs at `subgroup` lanes, in a stable order."""
    return sorted(n for n, s in sizes.items() if subgroup in s)


def check_on_lavapipe(args: list[str], width: int, subgroup: int) -> str:
    """`fusec check ARGS`, run from the checkout's root on lavapipe at LP_NATIVE_VECTOR_WIDTH
    `width` (a child process: lavapipe reads the width when its device is created), skipped
    where FUSEC_DEVICE selects another device.  Asserts exit 0, subgroup size `subgroup` on
    the device line and no mismatch; returns what it printed."""
    skip_unless_lavapipe()
    env = {**os.environ, "LP_NATIVE_VECTOR_WIDTH": str(width), "FUSEC_DEVICE": "llvmpipe"}
    if width == WIDE_WIDTH:
        # 512-bit vectors: without LLVM's optimization passes (Mesa's gallivm flag
        # GALLIVM_PERF=nopt) lavapipe compiles in about half the time (this check of a quarter
        # of kernels.fuse at small shapes, Mesa's shader cache empty: 234 -> 129 s) and runs
        # the same SPIR-V; 4 and 8 lanes, and every check at the defaults, stay optimized
        env.setdefault("GALLIVM_PERF", "nopt")
    proc = fusec_cli(["check", *args], capture_output=True, text=True, env=env, cwd=ROOT)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert f"subgroup {subgroup})" in proc.stdout and "MISMATCH" not in proc.stdout, proc.stdout
    return proc.stdout


def fusec_cli(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run the `fusec` command of this checkout in a child process (`subprocess.run` keyword
    arguments): the checkout goes first on the child's path, so a second checkout (a git
    worktree) tests its own code, not the one an editable install points at."""
    env = dict(kwargs.pop("env", None) or os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(ROOT), env.get("PYTHONPATH")) if p)
    return subprocess.run([sys.executable, "-m", "fusec", *args], env=env, **kwargs)
