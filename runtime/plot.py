"""Occupancy plots for `fusec occupancy --plot FILE.png` and `--html FILE.html`.

One panel per target: waves per SIMD (warps per scheduler on NVIDIA) against VGPRs per lane on a
log2 axis, with each wave size's occupancy staircase (no LDS, 256 lanes) and the kernels as
points.  Kernels at the same point, or so near it that their markers would touch, are one marker
with a count (`group_points`); only the kernels that matter are labelled: refused or over budget,
spilling, and those of the regions asked for with `--region`.  Labels are placed where they cover
no marker, no other label and no leader line (`_place_labels`).  The HTML report is the same
figure as inline SVG, where each point group carries a `<title>` listing its kernels (a hover
label in a browser), followed by a table of the groups; it loads nothing from the network.

The rows are those `fusec occupancy` computes (`runtime.cli._occupancy_rows`, with the `actual_*`
fields of `--actual` where a driver gave them).
"""

from __future__ import annotations

import html
import io
import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from .owned import write_owned

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.backend_bases import RendererBase
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

Row = Mapping[str, Any]

ESTIMATED = "estimated"
ACTUAL = "actual"
# worst first: a group takes the worst status of its kernels
STATUSES = ("refused", "spills", "accepted")
COLORS = {"refused": "#c62828", "spills": "#e07b00", "accepted": "#3b6fb6"}
LABEL_COLORS = {"refused": "#b71c1c", "spills": "#a85800", "accepted": "#202020"}
STATUS_NAMES = {
    "refused": "refused / over budget",
    "spills": "spills (within budget)",
    "accepted": "accepted",
}
STAIR_STYLES = {32: ("#7a7a7a", "-"), 64: ("#b0b0b0", "--")}
DPI = 110
PANEL_W, PANEL_H = 11.0, 4.3  # inches, one panel
MAX_LABEL_LINES = 4


@dataclass(frozen=True)
class Point:
    """One row as drawn: a kernel on one target and wave size, estimated or from the driver."""

    region: str
    kernel: str  # "fused", "fused.<i>", "unfused.<i>"
    name: str  # the kernel's name in the manifest
    target: str
    wave: int
    series: str  # ESTIMATED | ACTUAL
    vgprs: int
    waves: int
    status: str  # one of STATUSES
    labelled: bool
    reason: str

    @property
    def key(self) -> tuple[str, str]:
        return (self.region, self.kernel)


@dataclass
class Group:
    """Kernels drawn as one marker: same target, series and waves, VGPRs within a marker."""

    target: str
    series: str
    waves: int
    points: list[Point] = field(default_factory=list)

    @property
    def count(self) -> int:
        """Kernels in the group, each once (a kernel at wave32 and wave64 here counts one)."""
        return len({p.key for p in self.points})

    @property
    def vgprs(self) -> float:
        """Where the marker sits: the geometric mean of the members' VGPRs."""
        logs = [math.log2(max(p.vgprs, 1)) for p in self.points]
        return float(2 ** (sum(logs) / len(logs)))

    @property
    def vgpr_range(self) -> tuple[int, int]:
        return min(p.vgprs for p in self.points), max(p.vgprs for p in self.points)

    @property
    def status(self) -> str:
        return min((p.status for p in self.points), key=STATUSES.index)

    @property
    def labelled(self) -> list[Point]:
        return [p for p in self.points if p.labelled]

    def label_lines(self) -> list[str]:
        """One line per labelled region: its kernels and wave sizes."""
        by_region: dict[str, dict[str, set[int]]] = {}
        for p in self.labelled:
            by_region.setdefault(p.region, {}).setdefault(p.kernel, set()).add(p.wave)
        lines = []
        for region, kernels in by_region.items():
            waves = sorted(set().union(*kernels.values()))
            lines.append(f"{region}: {', '.join(kernels)} ({'/'.join(f'w{w}' for w in waves)})")
        if len(lines) > MAX_LABEL_LINES:
            lines = [*lines[: MAX_LABEL_LINES - 1], f"+{len(lines) - MAX_LABEL_LINES + 1} more"]
        return lines

    def title(self) -> str:
        """The hover text: the point and every kernel in the group."""
        lo, hi = self.vgpr_range
        where = f"{lo}" if lo == hi else f"{lo}-{hi}"
        unit = "warps per scheduler" if self.target == "sm90" else "waves per SIMD"
        head = (
            f"{self.target} ({self.series}): {self.count} kernel(s) at {where} VGPRs, "
            f"{self.waves} {unit}"
        )
        lines = [head]
        for p in sorted(self.points, key=lambda p: (p.region, p.kernel, p.wave)):
            note = "" if p.status == "accepted" else f" [{p.status}: {p.reason}]"
            lines.append(f"{p.region} {p.kernel} ({p.name}) w{p.wave}: {p.vgprs} VGPRs{note}")
        return "\n".join(lines)


def has_actual(rows: Iterable[Row]) -> bool:
    """Whether a driver gave numbers for any row (what the title may claim)."""
    return any(r.get("actual_vgprs") is not None for r in rows)


def measured(rows: Iterable[Row]) -> str:
    return "estimated and actual (driver)" if has_actual(rows) else "estimated"


def title(rows: Sequence[Row], source: str) -> str:
    return f"fusec occupancy {source}: {measured(rows)}"


def points(rows: Iterable[Row], regions: Sequence[str] = ()) -> list[Point]:
    """Each row's estimated point, and its driver point where `--actual` gave one."""
    selected = set(regions)
    out = []
    for r in rows:
        if not r["accepted"]:
            status = "refused"
        elif r["spills"]:
            status = "spills"
        else:
            status = "accepted"
        common = {
            "region": r["region"],
            "kernel": r["kernel"],
            "name": r.get("_name", r["region"]),
            "target": r["target"],
            "wave": r["wave"],
        }
        out.append(
            Point(
                **common,
                series=ESTIMATED,
                vgprs=r["vgprs"],
                waves=r["waves_per_simd"],
                status=status,
                labelled=status != "accepted" or r["region"] in selected,
                reason=r.get("reason", ""),
            )
        )
        if r.get("actual_vgprs") is not None and r.get("actual_waves_per_simd") is not None:
            spills = bool(r.get("actual_spills"))
            out.append(
                Point(
                    **common,
                    series=ACTUAL,
                    vgprs=r["actual_vgprs"],
                    waves=r["actual_waves_per_simd"],
                    status="spills" if spills else "accepted",
                    labelled=spills or r["region"] in selected,
                    reason="the driver spills" if spills else "",
                )
            )
    return out


def marker_size(count: int) -> float:
    """Marker diameter in points: wide enough for the count written in it."""
    return 6.0 if count <= 1 else min(22.0, 10.0 + 1.4 * math.sqrt(count))


def group_points(
    rows: Iterable[Row], regions: Sequence[str] = (), *, pt_per_octave: float = 72.0
) -> list[Group]:
    """Kernels at one point, or near enough that their markers would touch (on a log2 VGPR axis
    drawn `pt_per_octave` points per doubling), as one group per marker."""
    by_line: dict[tuple[str, str, int], dict[int, list[Point]]] = {}
    for p in points(rows, regions):
        by_line.setdefault((p.target, p.series, p.waves), {}).setdefault(p.vgprs, []).append(p)
    groups = []
    for (target, series, waves), at in by_line.items():
        line = [Group(target, series, waves, at[v]) for v in sorted(at)]
        merged = True
        while merged:  # merge the closest touching neighbours until none touch
            merged = False
            best: tuple[float, int] | None = None
            for i in range(len(line) - 1):
                a, b = line[i], line[i + 1]
                gap = math.log2(b.vgprs / a.vgprs) * pt_per_octave
                reach = (marker_size(a.count) + marker_size(b.count)) / 2 + 1.0
                if gap < reach and (best is None or gap - reach < best[0]):
                    best = (gap - reach, i)
            if best is not None:
                i = best[1]
                line[i : i + 2] = [
                    Group(target, series, waves, line[i].points + line[i + 1].points)
                ]
                merged = True
        groups += line
    order = {t: i for i, t in enumerate(dict.fromkeys(r.target for g in groups for r in g.points))}
    groups.sort(key=lambda g: (order[g.target], g.series != ESTIMATED, -g.waves, g.vgprs))
    return groups


def _x_limits(target_rows: Sequence[Row], max_vgprs: int) -> tuple[float, float]:
    xs = [r["vgprs"] for r in target_rows] + [
        r["actual_vgprs"] for r in target_rows if r.get("actual_vgprs") is not None
    ]
    lo = min([2, *xs])
    hi = max([max_vgprs, *xs])
    return max(lo, 1) / 1.35, hi * 1.5


def figure(
    rows: Sequence[Row], source: str, regions: Sequence[str] = (), min_waves: int | None = None
) -> tuple[Figure, list[Group]]:
    """The figure, and its point groups in drawing order (their artists' gids are `pg<i>`).

    One panel per target; where a driver gave numbers, each target has a second panel beside
    it with the driver's (allocated VGPRs, waves)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    targets = list(dict.fromkeys(r["target"] for r in rows))
    actual = has_actual(rows)
    panels = [(t, s) for t in targets for s in ((ESTIMATED, ACTUAL) if actual else (ESTIMATED,))]
    if actual:
        nrows, ncols = max(len(targets), 1), 2
    else:
        nrows, ncols = (len(targets), 1) if len(targets) <= 2 else (math.ceil(len(targets) / 2), 2)
    nrows = max(nrows, 1)
    panel_w = PANEL_W if ncols == 1 else 8.5
    top_in, bottom_in, hspace_in, wspace_in = 1.25, 0.55, 0.85, 0.9
    height = top_in + bottom_in + nrows * PANEL_H + (nrows - 1) * hspace_in
    width = 1.0 + panel_w * ncols + (ncols - 1) * wspace_in
    fig = Figure(figsize=(width, height), dpi=DPI)
    canvas = FigureCanvasAgg(fig)  # measures the labels, and draws the PNG
    fig.subplots_adjust(
        left=0.75 / width,
        right=1 - 0.25 / width,
        top=1 - top_in / height,
        bottom=bottom_in / height,
        hspace=hspace_in / PANEL_H,
        wspace=wspace_in / panel_w,
    )
    axes = fig.subplots(nrows, ncols, squeeze=False).ravel()
    for ax in axes[len(panels) :]:
        ax.set_visible(False)
    fig.suptitle(title(rows, source), fontsize=12, y=1 - 0.12 / height, va="top")

    all_groups: list[Group] = []
    statuses: set[str] = set()
    waves_drawn: set[int] = set()
    for ax, (target, series) in zip(axes, panels, strict=False):
        target_rows = [r for r in rows if r["target"] == target]
        waves_drawn |= _panel(ax, target, series, target_rows, min_waves)
        if series == ACTUAL and not has_actual(target_rows):
            ax.text(
                0.5,
                0.5,
                f"no driver statistics for {target}",
                transform=ax.transAxes,
                ha="center",
                va="center",
                fontsize=10,
                color="#606060",
            )
            continue
        x0, x1 = ax.get_xlim()
        pt_per_octave = ax.get_position().width * width * 72 / math.log2(x1 / x0)
        groups = [
            g
            for g in group_points(target_rows, regions, pt_per_octave=pt_per_octave)
            if g.series == series
        ]
        for g in groups:
            gid = f"pg{len(all_groups)}"
            all_groups.append(g)
            statuses.add(g.status)
            ax.plot(
                [g.vgprs],
                [g.waves],
                "o",
                ms=marker_size(g.count),
                mfc=COLORS[g.status],
                mec="white",
                mew=0.7,
                zorder=3,
                gid=gid,
            )
            if g.count > 1:
                ax.text(
                    g.vgprs,
                    g.waves,
                    str(g.count),
                    ha="center",
                    va="center_baseline",
                    fontsize=6.5 if g.count < 100 else 5.5,
                    color="white",
                    fontweight="bold",
                    zorder=5,
                    gid=f"{gid}t",
                )
        # matplotlib's backend_agg leaves get_renderer unannotated (its stubs type the rest)
        renderer: RendererBase = canvas.get_renderer()  # type: ignore[no-untyped-call]
        _place_labels(ax, renderer, groups)

    handles: list[Any] = [
        Line2D([], [], ls="", marker="o", ms=8, mfc=COLORS[s], mec="white", label=STATUS_NAMES[s])
        for s in STATUSES
        if s in statuses
    ]
    for wave in sorted(waves_drawn):
        color, style = STAIR_STYLES.get(wave, ("#999999", ":"))
        handles.append(
            Line2D([], [], color=color, ls=style, lw=1.1, label=f"wave{wave} limit (no LDS)")
        )
    if targets:
        floor = "budget minimum" if min_waves is not None else "default budget minimum"
        handles.append(Line2D([], [], color=COLORS["refused"], ls=(0, (5, 4)), lw=0.8, label=floor))
    fig.legend(
        handles=handles,
        loc="upper center",
        bbox_to_anchor=(0.5, 1 - 0.42 / height),
        ncol=max(len(handles), 1),
        fontsize=8.5,
        frameon=False,
        handletextpad=0.4,
        columnspacing=1.6,
        title="number in a marker: kernels at that point (each wave size counted once)",
        title_fontsize=8,
    )
    return fig, all_groups


def _panel(
    ax: Axes, target: str, series: str, target_rows: Sequence[Row], min_waves: int | None
) -> set[int]:
    """Axes, staircases, budget line and title of one panel; returns the wave sizes drawn."""
    from matplotlib.ticker import NullLocator

    from fusec.codegen.targets import TARGETS, occupancy

    t = TARGETS[target]
    nvidia = t.vendor == "nvidia"
    x0, x1 = _x_limits(target_rows, t.max_vgprs)
    ax.set_xscale("log", base=2)
    ax.set_xlim(x0, x1)
    ax.set_ylim(0, t.max_waves_per_simd + 2.5)
    ticks = [2**k for k in range(0, 12) if x0 <= 2**k <= x1]
    ax.set_xticks(ticks, [str(v) for v in ticks])
    ax.xaxis.set_minor_locator(NullLocator())
    ax.set_yticks(range(0, t.max_waves_per_simd + 1, 2))
    ax.grid(True, color="#e6e6e6", lw=0.6)
    ax.set_axisbelow(True)
    for wave in t.wave_sizes:
        color, style = STAIR_STYLES.get(wave, ("#999999", ":"))
        xs = list(range(1, t.max_vgprs + 1))
        ys = [occupancy(t, wave, v, 0, 256) for v in xs]
        ax.step(xs, ys, where="post", color=color, ls=style, lw=1.1, zorder=1)
    floor = min_waves if min_waves is not None else t.min_waves_default
    ax.axhline(floor, color=COLORS["refused"], lw=0.8, ls=(0, (5, 4)), zorder=1)
    ax.axvline(t.max_vgprs, color="#c0c0c0", lw=0.8, ls=":", zorder=1)
    ax.text(
        t.max_vgprs * 1.03,
        t.max_waves_per_simd + 2.2,
        f"max {t.max_vgprs}",
        fontsize=7,
        color="#808080",
        va="top",
    )
    ax.set_ylabel("warps per scheduler" if nvidia else "waves per SIMD", fontsize=9)
    what = "registers per thread" if nvidia else "VGPRs per lane"
    if series == ESTIMATED:
        ax.set_xlabel(f"{what} (estimated demand)", fontsize=9)
        kernels = {(r["region"], r["kernel"]) for r in target_rows}
        refused = {(r["region"], r["kernel"]) for r in target_rows if not r["accepted"]}
        spilling = {(r["region"], r["kernel"]) for r in target_rows if r["spills"]}
        head = f"{target}: {t.description} - estimated"
    else:
        ax.set_xlabel(f"{what} (allocated by the driver)", fontsize=9)
        measured_rows = [r for r in target_rows if r.get("actual_vgprs") is not None]
        kernels = {(r["region"], r["kernel"]) for r in measured_rows}
        refused = {(r["region"], r["kernel"]) for r in measured_rows if not r["accepted"]}
        spilling = {(r["region"], r["kernel"]) for r in measured_rows if r.get("actual_spills")}
        head = f"{target} - actual (driver)"
    ax.set_title(
        f"{head}: {len(kernels)} kernels, {len(refused)} refused or over budget, "
        f"{len(spilling)} spilling",
        fontsize=10,
        loc="left",
    )
    ax.tick_params(labelsize=8)
    return set(t.wave_sizes)


def _overlap(a: Bbox, b: Bbox) -> float:
    w = min(a.x1, b.x1) - max(a.x0, b.x0)
    h = min(a.y1, b.y1) - max(a.y0, b.y0)
    return w * h if w > 0 and h > 0 else 0.0


def _segment_hits_box(p: tuple[float, float], q: tuple[float, float], box: Bbox) -> bool:
    """Whether the segment p-q passes through the box (Liang-Barsky clipping)."""
    t0, t1 = 0.0, 1.0
    dx, dy = q[0] - p[0], q[1] - p[1]
    for d, lo, hi, at in ((dx, box.x0, box.x1, p[0]), (dy, box.y0, box.y1, p[1])):
        if d == 0:
            if at < lo or at > hi:
                return False
            continue
        a, b = (lo - at) / d, (hi - at) / d
        t0, t1 = max(t0, min(a, b)), min(t1, max(a, b))
        if t0 > t1:
            return False
    return True


def _segments_cross(
    a: tuple[float, float], b: tuple[float, float], c: tuple[float, float], d: tuple[float, float]
) -> bool:
    def side(p: tuple[float, float], q: tuple[float, float], r: tuple[float, float]) -> float:
        return (q[0] - p[0]) * (r[1] - p[1]) - (q[1] - p[1]) * (r[0] - p[0])

    return side(a, b, c) * side(a, b, d) < 0 and side(c, d, a) * side(c, d, b) < 0


def _box_distance(box: Bbox, x: float, y: float) -> float:
    return math.hypot(max(box.x0 - x, 0, x - box.x1), max(box.y0 - y, 0, y - box.y1))


# What a label's position may cost: a label over a label or outside the axes is unreadable, a
# label over a marker hides it, a leader line through a label or marker is only untidy.
OUTSIDE, ON_LABEL, ON_MARKER, LEADER_ON_LABEL, LEADER_ON_MARKER, LEADERS_CROSS = (
    100.0,
    20.0,
    6.0,
    4.0,
    1.0,
    1.0,
)
AMBIGUOUS = 0.5  # a label as near another marker as its own (NEAR_PX: pixels to spare)
NEAR_PX = 5.0
OFFSETS = (0, 10, 22, 36, 52, 72, 96, 124, 160, 200)  # points beyond the marker's edge
DIRECTIONS = (
    (1, 0),
    (-1, 0),
    (0, 1),
    (0, -1),
    (1, 1),
    (-1, 1),
    (1, -1),
    (-1, -1),
    (2, 1),
    (-2, 1),
    (2, -1),
    (-2, -1),
    (1, 2),
    (-1, 2),
    (1, -2),
    (-1, -2),
)


def _place_labels(ax: Axes, renderer: RendererBase, groups: Sequence[Group]) -> None:
    """Label the groups with labelled kernels, each where it covers no marker, no other label
    and no leader line and stays inside the axes, nearest its marker first; a label set apart
    is joined to its marker by a leader line that crosses no marker, label or other line.  The
    labels are placed one by one in a few orders, and the arrangement that costs least wins."""
    from matplotlib.text import Annotation
    from matplotlib.transforms import Bbox

    px = DPI / 72.0  # the figure is drawn at DPI
    to_px = ax.transData.transform
    outer = ax.get_window_extent(renderer)
    area = Bbox.from_extents(outer.x0 + 2, outer.y0 + 2, outer.x1 - 2, outer.y1 - 2)
    centres = [(float(x), float(y)) for x, y in (to_px((g.vgprs, g.waves)) for g in groups)]
    radii = [marker_size(g.count) / 2 * px + 1 for g in groups]
    markers = [
        Bbox.from_extents(x - r, y - r, x + r, y + r)
        for (x, y), r in zip(centres, radii, strict=True)
    ]
    todo = [i for i, g in enumerate(groups) if g.labelled]
    if not todo:
        return
    anns: dict[int, Annotation] = {}
    for i in todo:
        g = groups[i]
        status = min((p.status for p in g.labelled), key=STATUSES.index)
        anns[i] = ax.annotate(
            "\n".join(g.label_lines()),
            (g.vgprs, g.waves),
            xytext=(0, 0),
            textcoords="offset points",
            fontsize=7.5,
            color=LABEL_COLORS[status],
            zorder=6,
            bbox={"boxstyle": "round,pad=0.15", "fc": "white", "ec": "none", "alpha": 0.85},
        )

    Placement = tuple[float, float, Any, Any]  # offset x, y in points, ha, va

    def arrange(order: Sequence[int]) -> tuple[float, dict[int, Placement]]:
        placed: list[Bbox] = []
        segments: list[tuple[tuple[float, float], tuple[float, float]]] = []
        chosen: dict[int, Placement] = {}
        total = 0.0
        for i in order:
            ann, (cx, cy) = anns[i], centres[i]
            r_pt = marker_size(groups[i].count) / 2 + 3
            best: tuple[float, Placement, Bbox, Any] | None = None
            for extra in OFFSETS:
                for dx, dy in DIRECTIONS:
                    norm = math.hypot(dx, dy)
                    ox, oy = dx / norm * (r_pt + extra), dy / norm * (r_pt + extra)
                    ha: Literal["left", "right", "center"] = (
                        "left" if dx > 0 else "right" if dx < 0 else "center"
                    )
                    va: Literal["bottom", "top", "center"] = (
                        "bottom" if dy > 0 else "top" if dy < 0 else "center"
                    )
                    ann.set_position((ox, oy))
                    ann.set_horizontalalignment(ha)
                    ann.set_verticalalignment(va)
                    ext = ann.get_window_extent(renderer)
                    box = Bbox.from_extents(ext.x0 - 2, ext.y0 - 2, ext.x1 + 2, ext.y1 + 2)
                    cost = 0.0
                    if _overlap(box, area) < box.width * box.height - 0.5:
                        cost += OUTSIDE
                    cost += ON_MARKER * sum(_overlap(box, m) > 0 for m in markers)
                    cost += ON_LABEL * sum(_overlap(box, b) > 0 for b in placed)
                    cost += LEADER_ON_LABEL * sum(_segment_hits_box(p, q, box) for p, q in segments)
                    leader = None
                    if extra:
                        start = (cx + dx / norm * radii[i], cy + dy / norm * radii[i])
                        leader = (start, (cx + ox * px, cy + oy * px))
                        cost += LEADER_ON_MARKER * sum(
                            _segment_hits_box(*leader, m) for j, m in enumerate(markers) if j != i
                        )
                        cost += LEADER_ON_LABEL * sum(_segment_hits_box(*leader, b) for b in placed)
                        cost += LEADERS_CROSS * sum(
                            _segments_cross(*leader, p, q) for p, q in segments
                        )
                    # a label is read as its nearest marker's: without a leader line no other
                    # marker may be as near as its own, with one none may nearly touch it
                    near = NEAR_PX if extra else _box_distance(box, cx, cy) - radii[i] + NEAR_PX
                    cost += AMBIGUOUS * any(
                        _box_distance(box, x, y) - r <= near
                        for j, ((x, y), r) in enumerate(zip(centres, radii, strict=True))
                        if j != i
                    )
                    if best is None or cost < best[0]:
                        best = (cost, (ox, oy, ha, va), box, leader)
                    if cost == 0:
                        break
                if best is not None and best[0] == 0:
                    break
            assert best is not None
            cost, placement, box, leader = best
            total += cost
            chosen[i] = placement
            placed.append(box)
            if leader is not None:
                segments.append(leader)
        return total, chosen

    by_status = sorted(todo, key=lambda i: (STATUSES.index(groups[i].status), -groups[i].waves))
    orders = [
        by_status,
        sorted(todo, key=lambda i: (-groups[i].waves, groups[i].vgprs)),
        sorted(todo, key=lambda i: (groups[i].waves, groups[i].vgprs)),
        sorted(todo, key=lambda i: (-groups[i].vgprs, -groups[i].waves)),
        sorted(todo, key=lambda i: -len(groups[i].label_lines())),
    ]
    best_total, best_chosen = math.inf, {}
    for order in orders:
        total, chosen = arrange(order)
        if total < best_total:
            best_total, best_chosen = total, chosen
        if total == 0:
            break
    for i, (ox, oy, ha, va) in best_chosen.items():
        ann = anns[i]
        ann.set_position((ox, oy))
        ann.set_horizontalalignment(ha)
        ann.set_verticalalignment(va)
        r_pt = marker_size(groups[i].count) / 2
        if math.hypot(ox, oy) > r_pt + 3.5:
            ax.annotate(
                "",
                (groups[i].vgprs, groups[i].waves),
                xytext=(ox, oy),
                textcoords="offset points",
                arrowprops={
                    "arrowstyle": "-",
                    "color": ann.get_color(),
                    "lw": 0.6,
                    "shrinkA": 0,
                    "shrinkB": r_pt,
                },
                zorder=2,
            )


def write_png(
    rows: Sequence[Row],
    path: str | Path,
    source: str,
    regions: Sequence[str] = (),
    min_waves: int | None = None,
) -> None:
    """The figure as a PNG file, tagged (its `Software` text chunk) as fusec's, so that a later
    run may replace it; any other file at `path` is refused (runtime/owned.py)."""
    fig, _ = figure(rows, source, regions, min_waves)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=DPI, metadata={"Software": PNG_MARK})
    write_owned(Path(path), buf.getvalue(), _png_is_ours, "a plot fusec wrote")


# the PNG text chunk (keyword, NUL, text) that marks a plot fusec wrote
PNG_MARK = "fusec occupancy --plot"
_PNG_CHUNK = b"tEXtSoftware\x00" + PNG_MARK.encode()
# the second line of a page fusec wrote
HTML_MARK = "<!-- fusec occupancy --html: rewritten by each run -->"


def _png_is_ours(start: bytes) -> bool:
    return start.startswith(b"\x89PNG\r\n\x1a\n") and _PNG_CHUNK in start


def _html_is_ours(start: bytes) -> bool:
    return start.startswith(f"<!DOCTYPE html>\n{HTML_MARK}\n".encode())


def svg(
    rows: Sequence[Row], source: str, regions: Sequence[str] = (), min_waves: int | None = None
) -> tuple[str, list[Group]]:
    """The figure as an inline SVG element (no XML prolog, no namespaces to fetch), with a
    `<title>` in every point group's marker and count."""
    import matplotlib

    with matplotlib.rc_context({"svg.hashsalt": "fusec", "svg.fonttype": "path"}):
        fig, groups = figure(rows, source, regions, min_waves)
        buf = io.StringIO()
        fig.savefig(buf, format="svg", dpi=DPI, metadata={"Date": None, "Creator": None})
    text = buf.getvalue()
    text = text[text.index("<svg") :]
    text = re.sub(r"<metadata>.*?</metadata>\s*", "", text, flags=re.S)
    # inline SVG in HTML needs no namespace declarations (the parser knows svg and xlink)
    text = re.sub(r'\s+xmlns(:\w+)?="[^"]*"', "", text)
    for i, g in enumerate(groups):
        tip = f"<title>{html.escape(g.title())}</title>"
        for gid in (f"pg{i}", f"pg{i}t"):
            text = text.replace(f'<g id="{gid}">', f'<g id="{gid}">{tip}', 1)
    return text, groups


def write_html(
    rows: Sequence[Row],
    path: str | Path,
    source: str,
    regions: Sequence[str] = (),
    min_waves: int | None = None,
) -> None:
    """One self-contained page: the figure, then every point group and its kernels."""
    figure_svg, groups = svg(rows, source, regions, min_waves)
    heading = html.escape(title(rows, source))
    body = []
    for g in groups:
        lo, hi = g.vgpr_range
        where = f"{lo}" if lo == hi else f"{lo}&ndash;{hi}"
        kernels = "<br>".join(
            html.escape(
                f"{p.region} {p.kernel} ({p.name}) w{p.wave}: {p.vgprs} VGPRs"
                + ("" if p.status == "accepted" else f" [{p.status}: {p.reason}]")
            )
            for p in sorted(g.points, key=lambda p: (p.region, p.kernel, p.wave))
        )
        body.append(
            f'<tr class="{g.status}"><td>{html.escape(g.target)}</td><td>{g.series}</td>'
            f"<td>{where}</td><td>{g.waves}</td><td>{g.count}</td><td>{g.status}</td>"
            f"<td>{kernels}</td></tr>"
        )
    page = f"""<!DOCTYPE html>
{HTML_MARK}
<html lang="en">
<head>
<meta charset="utf-8">
<title>{heading}</title>
<style>
body {{ font-family: sans-serif; margin: 1em 2em; color: #202020; }}
svg {{ max-width: 100%; height: auto; }}
table {{ border-collapse: collapse; font-size: 0.85em; }}
td, th {{ border-bottom: 1px solid #ddd; padding: 0.2em 0.6em; vertical-align: top;
  text-align: left; }}
tr.refused td {{ color: {COLORS["refused"]}; }}
tr.spills td {{ color: {LABEL_COLORS["spills"]}; }}
</style>
</head>
<body>
<h1>{heading}</h1>
<p>Hover over a marker for the kernels it stands for.</p>
{figure_svg}
<h2>Point groups</h2>
<table>
<tr><th>target</th><th>series</th><th>VGPRs</th><th>waves</th><th>kernels</th><th>status</th>
<th>members</th></tr>
{chr(10).join(body)}
</table>
</body>
</html>
"""
    write_owned(Path(path), page.encode(), _html_is_ours, "a page fusec wrote")
