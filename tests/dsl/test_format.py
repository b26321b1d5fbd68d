"""dsl/format.py and `fusec fmt` (runtime/fmt_cmd.py): the canonical layout is a fixed point
(formatting twice changes nothing), formatting never changes the checked program (the region IR,
dumped without source positions), kernels.fuse is canonical, and the command checks, rewrites
(atomically, only on change) and refuses a syntax error with the parser's diagnostic."""

from __future__ import annotations

import argparse
import enum
import os
import stat
import subprocess
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
from hypothesis import HealthCheck, Phase, assume, given, settings

from fusec.dsl import format as F
from fusec.dsl import ir
from fusec.dsl.check import check
from fusec.dsl.diagnostics import DiagnosticError
from fusec.dsl.format import format_source
from fusec.dsl.parse import parse
from fusec.dsl.span import Span
from fusec.runtime.fmt_cmd import cmd_fmt, main
from tests.conftest import ROOT
from tests.fuzz.frontend import fuse_sources

# kernels.fuse, the test sources, the examples' (every `.fuse` under examples/) and the
# benchmarks' (bench/)
SOURCES = [
    ROOT / "kernels.fuse",
    *sorted((ROOT / "tests" / "data").glob("*.fuse")),
    *sorted((ROOT / "examples").rglob("*.fuse")),
    *sorted((ROOT / "bench").glob("*.fuse")),
]
# the diagnostic catalogue: most parse, and formatting must hold for those too
CATALOGUE = sorted((ROOT / "tests" / "dsl" / "errors").glob("*.fuse"))


# --- a structural dump of the region IR ----------------------------------------------------------
def dump_ir(node: Any, seen: dict[int, int] | None = None) -> Any:
    """The region IR as nested tuples, without spans.  Declarations (attrs records compared by
    identity: stages, buffers, constants, index variables, ...) are dumped whole where first met
    and as `("ref", class, n)` after, so shared references and their order are compared too."""
    seen = {} if seen is None else seen
    if attrs.has(type(node)):
        cls = type(node).__name__
        by_identity = "__eq__" not in vars(type(node))  # attrs eq=False: compared by identity
        if by_identity and id(node) in seen:
            return ("ref", cls, seen[id(node)])
        if by_identity:
            seen[id(node)] = len(seen)
        fields = tuple(
            (f.name, dump_ir(getattr(node, f.name), seen))
            for f in attrs.fields(type(node))
            if not isinstance(getattr(node, f.name), Span)
        )
        return (cls, fields)
    if isinstance(node, enum.Enum):
        return (type(node).__name__, node.name)
    if isinstance(node, (tuple, list)):
        return tuple(dump_ir(x, seen) for x in node)
    if isinstance(node, dict):
        return tuple((k, dump_ir(v, seen)) for k, v in sorted(node.items()))
    if isinstance(node, float):
        return ("float", repr(node))
    assert node is None or isinstance(node, (int, str, bool)), type(node)
    return node


def test_dump_ir_ignores_positions_but_not_meaning() -> None:
    text = (ROOT / "tests" / "data" / "scale.fuse").read_text()
    moved = "# a comment that moves every position\n\n" + text
    assert dump_ir(check(parse(moved, "s.fuse"))) == dump_ir(check(parse(text, "s.fuse")))
    changed = text.replace("x[n] * g[n]", "x[n] * g[n] + 1.0")
    assert dump_ir(check(parse(changed, "s.fuse"))) != dump_ir(check(parse(text, "s.fuse")))
    widened = text.replace("launch workgroup 64", "launch workgroup 128")
    assert dump_ir(check(parse(widened, "s.fuse"))) != dump_ir(check(parse(text, "s.fuse")))


def _program(text: str, path: str) -> ir.Program:
    return check(parse(text, path))


# --- (a) idempotence, (b) meaning ----------------------------------------------------------------
@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_sources_format_to_a_fixed_point_of_the_same_meaning(path: Path) -> None:
    text = path.read_text()
    formatted = format_source(text, str(path))
    assert format_source(formatted, str(path)) == formatted
    assert dump_ir(_program(formatted, str(path))) == dump_ir(_program(text, str(path)))


def test_catalogue_sources_that_parse_format_to_a_fixed_point() -> None:
    formatted_count = 0
    for path in CATALOGUE:
        text = path.read_text()
        try:
            formatted = format_source(text, path.name)
        except DiagnosticError:
            with pytest.raises(DiagnosticError):
                parse(text, path.name)
            continue
        formatted_count += 1
        assert format_source(formatted, path.name) == formatted, path.name
        assert parse(formatted, path.name) == parse(text, path.name), path.name
    assert formatted_count > 50


@settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=60,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.filter_too_much,
        HealthCheck.data_too_large,
    ],
)
@given(fuse_sources())
def test_generated_sources_format_to_a_fixed_point_of_the_same_meaning(source: str) -> None:
    try:
        program = _program(source, "gen.fuse")
    except DiagnosticError:
        assume(False)  # only sources that parse and check
        raise
    formatted = format_source(source, "gen.fuse")
    assert format_source(formatted, "gen.fuse") == formatted
    assert dump_ir(_program(formatted, "gen.fuse")) == dump_ir(program)


# --- the layout ----------------------------------------------------------------------------------
MESSY = """

# file comment{trailing}
  # indented file comment
region r(x: f32[N],   # first input
\ta: f32[N] in - 1 .. 2,

) -> (y: f32[N] ,
  z: f32[N]
   )   # after the signature
  const N=64 , eps=1e-6   # consts
# body comment written at column 1
  launch workgroup 64,subgroup 32|64
  t[i]=sin(  x[ i ] )-eps*max( k : x[ k ] )@workgroup in shared layout i->lane x 4 # t
  long_target_name[i] = - x[i] in global
  y[i]=t[i]
  z[i] = y[i]
      # written deeper than the body
# after the region



region s(x: f32[N]) -> y: f32[N]
  const N = 4
  launch workgroup 64
  y[n] = x[n]
""".replace("{trailing}", "   ")  # trailing whitespace, spelled out so that editors keep it
CANONICAL = """# file comment
# indented file comment
region r(x: f32[N],  # first input
        a: f32[N] in -1 .. 2,
) -> (y: f32[N],
        z: f32[N]
)  # after the signature
    const N = 64, eps = 1e-6  # consts
    # body comment written at column 1
    launch workgroup 64, subgroup 32 | 64
    t[i] = sin(x[i]) - eps * max(k: x[k]) @ workgroup   in shared  layout i -> lane x 4  # t
    long_target_name[i] = -x[i]                         in global
    y[i] = t[i]
    z[i] = y[i]
    # written deeper than the body
# after the region

region s(x: f32[N]) -> y: f32[N]
    const N = 4
    launch workgroup 64
    y[n] = x[n]
"""


def test_messy_source_takes_the_canonical_layout() -> None:
    assert format_source(MESSY, "m.fuse") == CANONICAL
    assert format_source(CANONICAL, "m.fuse") == CANONICAL


GENERIC_MESSY = """\
region  g < Wt in f16 , q8_0 ; At in f32,f16 >( x: At[H], Wg: Wt[F, H]) -> h: f32[F]
    const H = 4096 in 1 .. 16384, F = 12288 in 1 .. 1048576
    launch workgroup 256, subgroup any, rows_per_subgroup 2
    h[f] = sum(k: Wg[f, k] * x[k])  layout f -> subgroup, k -> lane x 8
    schedule   on sm90   when Wt=q8_0 :workgroup 512,rows_per_subgroup 1   # why
    schedule when Wt in q8_0:h layout k->lane x 32
    schedule when Wt in q8_0 : x in shared as q8_0
    schedule:int8 dot
instance  g2=g< q8_0,f16 > with H=8192
"""
GENERIC_CANONICAL = """\
region g<Wt in f16, q8_0; At in f32, f16>(x: At[H], Wg: Wt[F, H]) -> h: f32[F]
    const H = 4096 in 1 .. 16384, F = 12288 in 1 .. 1048576
    launch workgroup 256, subgroup any, rows_per_subgroup 2
    h[f] = sum(k: Wg[f, k] * x[k])                      layout f -> subgroup, k -> lane x 8
    schedule on sm90 when Wt = q8_0: workgroup 512, rows_per_subgroup 1  # why
    schedule when Wt in q8_0: h layout k -> lane x 32
    schedule when Wt in q8_0: x in shared as q8_0
    schedule: int8 dot
instance g2 = g<q8_0, f16> with H = 8192
"""


def test_dtype_parameters_schedule_and_instance_lines_take_the_canonical_layout() -> None:
    formatted = format_source(GENERIC_MESSY, "g.fuse")
    assert formatted == GENERIC_CANONICAL
    assert format_source(formatted, "g.fuse") == formatted
    assert parse(formatted, "g.fuse") == parse(GENERIC_MESSY, "g.fuse")


INSTANCE_BLOCK_MESSY = """\
region r<Wt in f16, q4_0>(x: f32[K], W: Wt[N, K]) -> y: f32[N]
    const K = 64, N = 32
    launch workgroup 64, subgroup any, rows_per_subgroup 1
    y[n] = sum(k: W[n, k] * x[k])  layout n -> subgroup, k -> lane x 8
instance  r_wide=r< q4_0 >   with K=128
    schedule :  y layout k->lane x 16   # its own
    schedule:rows_per_subgroup 2
"""
INSTANCE_BLOCK_CANONICAL = """\
region r<Wt in f16, q4_0>(x: f32[K], W: Wt[N, K]) -> y: f32[N]
    const K = 64, N = 32
    launch workgroup 64, subgroup any, rows_per_subgroup 1
    y[n] = sum(k: W[n, k] * x[k])                       layout n -> subgroup, k -> lane x 8
instance r_wide = r<q4_0> with K = 128
    schedule: y layout k -> lane x 16  # its own
    schedule: rows_per_subgroup 2
"""


def test_an_instance_lines_schedule_block_takes_the_canonical_layout() -> None:
    formatted = format_source(INSTANCE_BLOCK_MESSY, "i.fuse")
    assert formatted == INSTANCE_BLOCK_CANONICAL
    assert format_source(formatted, "i.fuse") == formatted
    module = parse(formatted, "i.fuse")
    assert module == parse(INSTANCE_BLOCK_MESSY, "i.fuse")
    (decl,) = module.instances
    assert decl.schedules is not None and len(decl.schedules) == 2


def test_stage_alignment() -> None:
    """`=` after the longest target of at most 11 characters; clauses at column 57 or two past
    the run's longest expression (`row`), unless that is past column 81 (`y`); a blank line
    ends the run (`o`)."""
    source = """region r(x: f32[N], W: f32[N, N]) -> (y: f32[N], o: f32[N])
    const N = 64
    launch workgroup 64, subgroup any
    a = sum(k: x[k]) @ workgroup in shared
    bb[i] = x[i] * a in shared
    row[n] = sum(k: W[n, k] * bb[k] * x[k] * a * a * a) layout n -> subgroup, k -> lane x 4
    much_longer_target[n] = row[n] in shared
    y[n] = much_longer_target[n] + sum(k: W[n, k] * W[k, n] * bb[k] * bb[n] * x[k]) in shared

    o[n] = y[n] in global
"""
    assert format_source(source, "a.fuse") == (
        """region r(x: f32[N], W: f32[N, N]) -> (y: f32[N], o: f32[N])
    const N = 64
    launch workgroup 64, subgroup any
    a      = sum(k: x[k]) @ workgroup                    in shared
    bb[i]  = x[i] * a                                    in shared
    row[n] = sum(k: W[n, k] * bb[k] * x[k] * a * a * a)  layout n -> subgroup, k -> lane x 4
    much_longer_target[n] = row[n]                       in shared
    y[n]   = much_longer_target[n] + sum(k: W[n, k] * W[k, n] * bb[k] * bb[n] * x[k])  in shared

    o[n] = y[n]                                         in global
"""
    )


def test_blank_lines_collapse_and_separate_regions() -> None:
    region = "region {}(x: f32[N]) -> y: f32[N]\n    const N = 4\n    launch workgroup 64\n"
    source = region.format("a") + "\n\n\n    y[n] = x[n]\n# about b\n" + region.format("b")
    source += "    y[n] = x[n]\n\n\n"
    assert format_source(source, "b.fuse") == (
        region.format("a")
        + "\n    y[n] = x[n]\n\n# about b\n"
        + region.format("b")
        + "    y[n] = x[n]\n"
    )


def test_comment_lines_keep_their_block() -> None:
    source = """region r(m: f32[T, 16]) -> C: f32[T, 4, 4]
    const T = 4
    launch workgroup 64, subgroup >= 16 else shared
    tile (src: 4, dst: 4) lane dst + 4 * src, per t
    c = m[t, dst + 4 * src]
    repeat 2:
      c = c / sum(dst: c)
      # in the repeat block
   # after it, in the region body
    C[t, src, dst] = c
  # still in the body
# at the top level
"""
    assert format_source(source, "c.fuse") == (
        """region r(m: f32[T, 16]) -> C: f32[T, 4, 4]
    const T = 4
    launch workgroup 64, subgroup >= 16 else shared
    tile (src: 4, dst: 4) lane dst + 4 * src, per t
    c = m[t, dst + 4 * src]
    repeat 2:
        c = c / sum(dst: c)
        # in the repeat block
    # after it, in the region body
    C[t, src, dst] = c
    # still in the body
# at the top level
"""
    )


def test_line_endings_and_empty_sources() -> None:
    crlf = "region r(x: f32[N]) -> y: f32[N]\r\n    const N = 4 # c\r\n"
    crlf += "    launch workgroup 64\r\n    y[n] = x[n]"
    assert format_source(crlf, "d.fuse") == (
        "region r(x: f32[N]) -> y: f32[N]\n    const N = 4  # c\n"
        "    launch workgroup 64\n    y[n] = x[n]\n"
    )
    assert format_source("", "e.fuse") == ""
    assert format_source("\n\n# only a comment\n\n", "e.fuse") == "# only a comment\n"


def test_syntax_error_is_the_parsers_diagnostic() -> None:
    path = ROOT / "tests" / "dsl" / "errors" / "syntax_missing_paren.fuse"
    text = path.read_text()
    with pytest.raises(DiagnosticError) as formatted:
        format_source(text, "tests/dsl/errors/syntax_missing_paren.fuse")
    with pytest.raises(DiagnosticError) as parsed:
        parse(text, "tests/dsl/errors/syntax_missing_paren.fuse")
    assert formatted.value.render() == parsed.value.render()
    expected = path.with_suffix(".err").read_text().rstrip("\n")
    assert formatted.value.render() == expected


def test_a_changed_token_is_caught(monkeypatch: pytest.MonkeyPatch) -> None:
    """The formatter checks its own output: were it to drop a token, it says so (our bug)."""
    real = F._lay_out
    monkeypatch.setattr(F, "_lay_out", lambda toks, text, ind: real(toks[:-1] or toks, text, ind))
    with pytest.raises(AssertionError, match="fusec fmt"):
        format_source((ROOT / "tests" / "data" / "scale.fuse").read_text(), "scale.fuse")


# --- (c), (d) the command ------------------------------------------------------------------------
def _args(path: Path | str, check: bool = False, write: bool = False) -> argparse.Namespace:
    return argparse.Namespace(file=str(path), check=check, write=write)


def test_kernels_fuse_is_canonical(capsys: pytest.CaptureFixture[str]) -> None:
    assert cmd_fmt(_args(ROOT / "kernels.fuse", check=True)) == 0
    assert capsys.readouterr().out == ""


def test_fmt_prints_the_formatted_text(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.fuse"
    path.write_text(MESSY)
    assert cmd_fmt(_args(path)) == 0
    assert capsys.readouterr().out == CANONICAL
    assert path.read_text() == MESSY


def test_check_then_write(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.fuse"
    path.write_text(MESSY)
    path.chmod(0o640)
    assert cmd_fmt(_args(path, check=True)) == 1
    out = capsys.readouterr().out
    assert out.startswith(f"{path}: would reformat\n--- {path}\n+++ {path} (formatted)\n")
    assert "-  const N=64 , eps=1e-6   # consts\n" in out
    assert "+    const N = 64, eps = 1e-6  # consts\n" in out
    assert path.read_text() == MESSY

    assert cmd_fmt(_args(path, write=True)) == 0
    assert path.read_text() == CANONICAL
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.fuse"]  # no temporary left
    assert capsys.readouterr().out == ""

    before = os.stat(path)
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns - 10**9))  # a second back
    earlier = path.stat().st_mtime_ns
    assert cmd_fmt(_args(path, write=True)) == 0
    assert path.stat().st_mtime_ns == earlier
    assert path.stat().st_ino == before.st_ino
    assert cmd_fmt(_args(path, check=True)) == 0


def test_write_follows_a_symbolic_link(tmp_path: Path) -> None:
    target = tmp_path / "real.fuse"
    target.write_text(MESSY)
    link = tmp_path / "link.fuse"
    link.symlink_to(target)
    assert cmd_fmt(_args(link, write=True)) == 0
    assert link.is_symlink()
    assert target.read_text() == CANONICAL


def test_write_refuses_a_read_only_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "m.fuse"
    path.write_text(MESSY)
    path.chmod(0o444)
    if os.access(path, os.W_OK):
        pytest.skip("running as a user who may write anything (root)")
    assert main([str(path), "--write"]) == 1
    assert capsys.readouterr().err == (
        f"fusec: error: cannot write {path}: it is read-only\n"
        "  hint: make it writable, or drop --write\n"
    )
    assert path.read_text() == MESSY
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m.fuse"]


def test_syntax_error_leaves_the_file_alone(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "bad.fuse"
    text = "region r(x: f32[K] -> y: f32[K]\n    const K = 8\n"
    path.write_text(text)
    mtime = path.stat().st_mtime_ns
    for flags in ([], ["--check"], ["--write"]):
        assert main([str(path), *flags]) == 1
        captured = capsys.readouterr()
        assert captured.out == ""
        assert captured.err.startswith(f"{path}:1:20: error: unexpected '->'\n")
        assert "\n  hint: expected ')', ',', 'in'" in captured.err
    assert path.read_text() == text
    assert path.stat().st_mtime_ns == mtime


def test_check_and_write_together_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = tmp_path / "m.fuse"
    path.write_text(MESSY)
    assert main([str(path), "--check", "--write"]) == 1
    assert capsys.readouterr().err == (
        "fusec: error: fmt takes --check or --write, not both\n"
        "  hint: --check reports a file that is not canonical; --write rewrites it\n"
    )
    assert path.read_text() == MESSY


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main([str(tmp_path / "none.fuse")]) == 1
    assert capsys.readouterr().err == (
        f"fusec: error: cannot read {tmp_path / 'none.fuse'}: no such file\n"
    )


def test_module_entry_point() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "fusec.runtime.fmt_cmd", "kernels.fuse", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
