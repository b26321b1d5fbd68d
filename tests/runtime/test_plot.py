"""`fusec occupancy --plot/--html` (runtime/plot.py): kernels at one point drawn once with a
count, labels only for refused, spilling and `--region` kernels and never over one another, a
title that says what was measured, a PNG of reasonable size and a self-contained HTML page."""

from __future__ import annotations

import itertools
import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from fusec.runtime import plot
from tests.conftest import ROOT

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _row(
    region: str,
    kernel: str = "fused",
    *,
    target: str = "gfx1201",
    wave: int = 32,
    vgprs: int = 4,
    waves: int = 16,
    spills: int = 0,
    accepted: bool = True,
    **extra: Any,
) -> dict[str, Any]:
    return {
        "region": region,
        "kernel": kernel,
        "target": target,
        "wave": wave,
        "vgprs": vgprs,
        "sgprs": 10,
        "lds_bytes": 0,
        "spills": spills,
        "waves_per_simd": waves,
        "accepted": accepted,
        "reason": "within budget" if accepted else f"{target} wave{wave}: over budget",
        "_name": f"{region}__{kernel}",
        "_workgroup": 256,
        **extra,
    }


def _crowd(n: int = 160) -> list[dict[str, Any]]:
    """n kernels, most of them at a few points at 16 waves, both wave sizes, two targets."""
    rows = []
    for i in range(n):
        vgprs = (3, 4, 5, 21, 66)[i % 5] if i % 7 else 20 + i % 40
        for target, waves in (("gfx1201", (32, 64)), ("sm90", (32,))):
            for w in waves:
                rows.append(_row(f"r{i}", target=target, wave=w, vgprs=vgprs))
    return rows


def _group_of(groups: list[plot.Group], region: str, target: str = "gfx1201") -> plot.Group:
    (g,) = [g for g in groups if g.target == target and any(p.region == region for p in g.points)]
    return g


def test_kernels_at_one_point_are_one_group_with_their_count() -> None:
    rows = [_row(f"a{i}", wave=w) for i in range(5) for w in (32, 64)]  # 5 kernels, 2 waves
    rows.append(_row("far", vgprs=200, waves=6))
    groups = plot.group_points(rows)
    assert len(groups) == 2
    at4 = _group_of(groups, "a0")
    assert at4.count == 5 and len(at4.points) == 10
    assert at4.vgprs == pytest.approx(4) and at4.waves == 16
    assert _group_of(groups, "far").count == 1
    # every kernel is in exactly one group per target and series
    seen = [(p.region, p.kernel, p.wave) for g in groups for p in g.points]
    assert len(seen) == len(set(seen)) == len(rows)


def test_nearly_the_same_point_is_merged_and_far_points_are_not() -> None:
    rows = [_row("x", vgprs=20), _row("y", vgprs=21), _row("z", vgprs=64)]
    groups = plot.group_points(rows, pt_per_octave=72.0)
    assert _group_of(groups, "x") is _group_of(groups, "y")
    assert _group_of(groups, "x").count == 2 and _group_of(groups, "x").vgpr_range == (20, 21)
    assert _group_of(groups, "z").count == 1
    # a different number of waves is never the same point
    assert len(plot.group_points([_row("p", waves=16), _row("q", waves=14)])) == 2
    # nor another target
    assert len(plot.group_points([_row("p"), _row("q", target="sm90")])) == 2


def test_a_refused_kernel_is_labelled_even_inside_a_crowd() -> None:
    rows = [_row(f"ok{i}") for i in range(40)]
    rows.append(_row("bad", accepted=False))
    rows.append(_row("hot", vgprs=5, spills=3))
    groups = plot.group_points(rows)
    crowd = _group_of(groups, "bad")
    assert crowd.count == 41 and crowd.status == "refused"
    assert [p.region for p in crowd.labelled] == ["bad"]
    assert crowd.label_lines() == ["bad: fused (w32)"]
    hot = _group_of(groups, "hot")
    assert hot.status == "spills" and [p.region for p in hot.labelled] == ["hot"]
    fig, _ = plot.figure(rows, "t.fuse")
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert "bad: fused (w32)" in texts and "hot: fused (w32)" in texts
    assert not any("ok" in t for t in texts)


def test_region_selects_the_labels() -> None:
    rows = [_row("a"), _row("b", "fused"), _row("b", "unfused.0", wave=64), _row("c", vgprs=40)]
    assert not any(g.labelled for g in plot.group_points(rows))
    groups = plot.group_points(rows, ["b"])
    labelled = {(p.region, p.kernel) for g in groups for p in g.labelled}
    assert labelled == {("b", "fused"), ("b", "unfused.0")}
    assert _group_of(groups, "b").label_lines() == ["b: fused, unfused.0 (w32/w64)"]


def test_title_says_what_was_measured() -> None:
    rows = [_row("a")]
    assert plot.title(rows, "k.fuse") == "fusec occupancy k.fuse: estimated"
    # --actual with no driver numbers: nothing actual was drawn
    assert plot.title([_row("a", actual_vgprs=None)], "k.fuse").endswith(": estimated")
    actual = [
        _row("a", actual_vgprs=24, actual_spills=0, actual_waves_per_simd=16),
        _row("b", target="sm90"),
    ]
    assert plot.title(actual, "k.fuse") == "fusec occupancy k.fuse: estimated and actual (driver)"
    fig, groups = plot.figure(actual, "k.fuse")
    assert fig.get_suptitle() == "fusec occupancy k.fuse: estimated and actual (driver)"
    # a driver panel beside each target's estimates; sm90 had no statistics
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_visible()]
    assert len(titles) == 4 and "gfx1201 - actual (driver)" in titles[1]
    assert {g.series for g in groups} == {plot.ESTIMATED, plot.ACTUAL}
    fig, _ = plot.figure([_row("a")], "k.fuse")
    assert fig.get_suptitle() == "fusec occupancy k.fuse: estimated"
    assert len([ax for ax in fig.axes if ax.get_visible()]) == 1


def test_one_panel_per_target() -> None:
    rows = [_row("a", target=t) for t in ("gfx1201", "sm90", "navi21")]
    fig, _ = plot.figure(rows, "k.fuse")
    titles = [ax.get_title(loc="left") for ax in fig.axes if ax.get_visible()]
    assert [t.split(":")[0] for t in titles] == ["gfx1201", "sm90", "navi21"]


def test_labels_cover_no_label_and_no_marker() -> None:
    rows = _crowd(150)
    rows += [_row(f"bad{i}", vgprs=(3, 21, 66, 90)[i % 4], accepted=False) for i in range(8)]
    rows += [_row(f"sel{i}", vgprs=6 + i, waves=14) for i in range(6)]
    fig, groups = plot.figure(rows, "k.fuse", regions=[f"sel{i}" for i in range(6)])
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    for ax in fig.axes:
        labels = [t for t in ax.texts if ":" in t.get_text()]
        boxes = [t.get_window_extent(renderer) for t in labels]
        for a, b in itertools.combinations(boxes, 2):
            assert not a.overlaps(b), (a, b)
        area = ax.get_window_extent(renderer)
        for box in boxes:
            assert area.x0 <= box.x0 and box.x1 <= area.x1, box
            assert area.y0 <= box.y0 and box.y1 <= area.y1, box
        markers = [line for line in ax.lines if (line.get_gid() or "").startswith("pg")]
        for line in markers:
            x, y = ax.transData.transform(np.asarray(line.get_xydata())[0])
            for box in boxes:
                assert not box.contains(x, y), (line.get_gid(), box)
    assert sum(1 for g in groups if g.labelled) >= 8


def test_png_is_written_and_of_reasonable_size(tmp_path: Path) -> None:
    from PIL import Image

    path = tmp_path / "occ.png"
    plot.write_png(_crowd(), path, "k.fuse")
    data = path.read_bytes()
    assert data.startswith(PNG_MAGIC)
    assert 20_000 < len(data) < 300_000
    with Image.open(path) as im:
        im.verify()
    with Image.open(path) as im:
        assert 800 < im.width < 2500 and 800 < im.height < 2500


def test_html_is_self_contained_and_names_every_kernel(tmp_path: Path) -> None:
    rows = [*_crowd(40), _row("bad", vgprs=290, waves=2, spills=34, accepted=False)]
    path = tmp_path / "occ.html"
    plot.write_html(rows, path, "k.fuse", regions=["r3"])
    page = path.read_text()
    assert "http://" not in page and "https://" not in page
    assert "<script" not in page and "<link" not in page and "src=" not in page
    assert page.count("<svg") == 1
    _, groups = plot.svg(rows, "k.fuse", ["r3"])
    assert len(groups) > 5
    for i in range(len(groups)):
        assert re.search(rf'<g id="pg{i}"><title>[^<]+</title>', page), i
    for r in rows:
        assert f"{r['region']} {r['kernel']} ({r['_name']}) w{r['wave']}" in page
    assert "fusec occupancy k.fuse: estimated" in page


@pytest.mark.slow
@pytest.mark.shaderc
def test_occupancy_plot_and_html_of_over_budget(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from fusec.runtime.cli import main

    monkeypatch.chdir(ROOT)
    png, page = tmp_path / "ob.png", tmp_path / "ob.html"
    args = ["occupancy", "tests/data/over_budget.fuse", "--target", "gfx1201", "--target", "sm90"]
    assert main([*args, "--plot", str(png), "--html", str(page)]) == 0
    capsys.readouterr()
    assert png.read_bytes().startswith(PNG_MAGIC) and 20_000 < png.stat().st_size < 300_000
    html = page.read_text()
    assert "http://" not in html and "https://" not in html
    # the refused fusions are named, on both targets
    for name in ("wide_rows", "big_tile", "lds_hog"):
        assert name in html
    assert "refused" in html
    fig, groups = plot.figure(
        _rows_of(main, args, capsys), "tests/data/over_budget.fuse", ["lds_hog"]
    )
    labels = "\n".join(t.get_text() for ax in fig.axes for t in ax.texts)
    for line in ("wide_rows: fused, unfused.0 (w32)", "big_tile: fused (w64)"):
        assert line in labels
    assert {g.target for g in groups} == {"gfx1201", "sm90"}
    assert main([*args, "--plot", str(png), "--region", "nope"]) == 1
    assert "no region 'nope'" in capsys.readouterr().err
    # --region: that region only, every one of its kernels labelled
    only = _rows_of(main, [*args, "--region", "lds_hog"], capsys)
    assert only and {r["region"] for r in only} == {"lds_hog"}
    assert all(p.labelled for p in plot.points(only, ["lds_hog"]))


def _rows_of(main: Any, args: list[str], capsys: pytest.CaptureFixture[str]) -> list[Any]:
    import json

    assert main([*args, "--json"]) == 0
    rows: list[Any] = json.loads(capsys.readouterr().out)
    return rows


@pytest.mark.parametrize("kind", ["png", "html"])
def test_a_file_fusec_did_not_write_is_never_replaced(tmp_path: Path, kind: str) -> None:
    """`--plot FILE` and `--html FILE` replace a file only where fusec wrote it: a file of the
    user's (random bytes), a folder, a symbolic link to a plot fusec wrote, or a file under a
    missing folder is one sentence, and everything there stays as it was (runtime/owned.py)."""
    from fusec.dsl.diagnostics import DiagnosticError

    write = plot.write_png if kind == "png" else plot.write_html
    rows = _crowd(12)
    ours = tmp_path / f"ours.{kind}"
    write(rows, ours, "k.fuse")
    first = ours.read_bytes()
    write(rows, ours, "k.fuse")  # fusec's own file: replaced (here by the same bytes)
    assert ours.read_bytes() == first
    theirs = tmp_path / f"theirs.{kind}"
    # the user's file, even one that starts like ours
    user = (first[:8] if kind == "png" else b"<!DOCTYPE html>\n") + np.random.bytes(256)
    theirs.write_bytes(user)
    folder = tmp_path / "folder"
    folder.mkdir()
    link = tmp_path / f"link.{kind}"
    link.symlink_to(ours)
    for target, why in [
        (theirs, f"not a {'plot' if kind == 'png' else 'page'} fusec wrote"),
        (folder, "a folder"),
        (link, "a symbolic link"),
        (tmp_path / "missing" / f"x.{kind}", "No such file or directory"),
    ]:
        with pytest.raises(DiagnosticError) as info:
            write(rows, target, "k.fuse")
        assert why in str(info.value), (target, info.value)
    assert theirs.read_bytes() == user and ours.read_bytes() == first
    assert list(folder.iterdir()) == [] and link.is_symlink()
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["folder", f"link.{kind}", f"ours.{kind}", f"theirs.{kind}"]
    )
