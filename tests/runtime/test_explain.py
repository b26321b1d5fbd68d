"""`fusec explain FILE --region R [--target T]` (runtime/explain.py): every phase of every kernel
of the region, with its source line, what it became and its share of the register estimate,
measured again on SPIR-V with line information; the peak agrees with the build's estimate."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path
from typing import Any

import pytest

from fusec.runtime.cli import main
from tests.conftest import ROOT

pytestmark = pytest.mark.shaderc


def _explain(args: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    rc = main(["explain", *args, "--width", "200"])
    out, err = capsys.readouterr()
    assert rc == 0, err
    return out


@pytest.mark.parametrize(
    "region", ["qkv_rope", "rms_norm_gated_ffn", "dsv4_hc_comb_slots", "dsv4_hc_comb"]
)
def test_every_phase_is_explained_and_the_peak_is_the_estimate(
    region: str, kernels_folder: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    src = ROOT / "kernels.fuse"
    target = random.choice(["gfx1201", "navi31"])
    # the session's build: estimates and verdicts for every known target, whichever it checks
    manifest: dict[str, Any] = json.loads((kernels_folder / "manifest.json").read_text())
    # on a target with a variant of the region (`schedule on T` lines), the variant is what
    # runs there and what is explained
    by_name = {r["name"]: r for r in manifest["regions"]}
    shown = f"{region}__{target}" if f"{region}__{target}" in by_name else region
    data = by_name[shown]
    out = _explain([str(src), "--region", region, "--target", target], capsys)
    assert f"region {shown} (" in out
    if shown != region:
        assert out.startswith(f"on {target}, {region} runs as its variant {shown} ")
    assert f"fused product: {len(data['fused'])} kernel(s)" in out
    assert f"unfused chain: {len(data['unfused'])} kernel(s)" in out
    peaks = [int(v) for v in re.findall(r"^peak (\d+) VGPRs", out, re.M)]
    kernels = data["fused"] + data.get("fused_shared", []) + data["unfused"]
    assert len(peaks) == len(kernels)
    for k, peak in zip(kernels, peaks, strict=True):
        assert f"kernel {k['name']}:" in out
        est = next(e for e in k["estimates"] if e["target"] == target)
        assert peak == est["vgprs"], (k["name"], peak, est)  # no private arrays here
    for wave, verdict in data["verdicts"][target].items():
        assert f"{target} wave{wave}: runs {'fused' if verdict['accepted'] else 'unfused'}" in out
    # every stage line of the region appears with its GLSL
    lines = {int(n) for n in re.findall(r"^GLSL of line (\d+):", out, re.M)}
    inlined = {int(n) for n in re.findall(r"^line (\d+): '\w+' has no code of its own", out, re.M)}
    assert not lines & inlined
    lines |= inlined
    # a stage group's use: its stages are listed at the group's lines, `via` the use's
    lines |= {int(n) for n in re.findall(r" via (\d+)", out)}
    text = src.read_text().splitlines()
    # a generic region's header: `region R<Wt in ...>(`
    start = next(
        i for i, t in enumerate(text) if t.startswith((f"region {region}(", f"region {region}<"))
    )
    stage_lines = [
        i + 1
        for i in range(start + 1, len(text))
        if text[i].startswith("    ")
        and "=" in text[i].split("#")[0]
        and not text[i]
        .strip()
        .startswith(("const", "launch", "tile", "budget", "param", "schedule"))
    ]
    stage_lines = [
        n
        for n in stage_lines
        if n
        < next((j + 1 for j in range(start + 1, len(text)) if text[j].startswith("region ")), 10**9)
    ]
    assert set(stage_lines) <= lines, (sorted(stage_lines), sorted(lines))
    # a tile's dimensions read as the source writes them, not as IR objects
    assert "Lit(" not in out and "ConstRef(" not in out


def test_an_unknown_region_is_one_sentence(capsys: pytest.CaptureFixture[str]) -> None:
    rc = main(["explain", str(ROOT / "tests" / "data" / "scale.fuse"), "--region", "nope"])
    err = capsys.readouterr().err
    assert rc == 1 and "no region 'nope'" in err and "Traceback" not in err


def test_an_instance_is_explained_by_its_display_name(capsys: pytest.CaptureFixture[str]) -> None:
    out = _explain([str(ROOT / "kernels.fuse"), "--region", "matvec_add<q6_K>"], capsys)
    assert out.splitlines()[0].startswith("region matvec_add_q6_K (")
    assert out.splitlines()[0].endswith(", instance matvec_add<q6_K>)")
    assert "kernel matvec_add_q6_K:" in out
