"""Shared fixtures: repository root, tier detection (shaderc, vulkan)."""

from __future__ import annotations

import functools
from pathlib import Path

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


@pytest.fixture
def root(monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.chdir(ROOT)
    return ROOT
