"""Shared fixtures: repository root, tier detection (shaderc, vulkan)."""

from __future__ import annotations

import functools
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent


@functools.cache
def has_compiler() -> bool:
    from codegen.shaderc import backend

    return backend() != "none"


@functools.cache
def vulkan_device_name() -> str | None:
    from runtime.device import Device, RuntimeFailure

    try:
        with Device() as dev:
            return dev.info.name
    except RuntimeFailure:
        return None


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if "shaderc" in item.keywords and not has_compiler():
            item.add_marker(pytest.mark.skip(reason="no shaderc extension and no glslc"))
        if "vulkan" in item.keywords and vulkan_device_name() is None:
            item.add_marker(pytest.mark.skip(reason="no Vulkan device (install lavapipe)"))


@pytest.fixture(scope="session", autouse=True)
def _build_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """`occupancy` and `check FILE` build into a cache folder: the suite's own, never the
    user's ~/.cache (child processes inherit it)."""
    import os

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
def build(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """kernels.fuse built once for the session (a test module may define its own `build`)."""
    from codegen.build import build_file
    from runtime.dispatch import Build

    out = tmp_path_factory.mktemp("kernels") / "build"
    build_file(ROOT / "kernels.fuse", out)
    return Build.load(out)


@pytest.fixture(scope="session")
def dev() -> Iterator[Any]:
    """The default Vulkan device, opened once for the session."""
    from runtime.device import Device

    with Device() as d:
        yield d


def fusec_cli(args: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    """Run the `fusec` command in a child process (`subprocess.run` keyword arguments)."""
    return subprocess.run([sys.executable, "-m", "runtime.cli", *args], **kwargs)
