"""dsl/highlight.py: the Pygments lexer of `.fuse` covers every source we have and every
generated one (no error tokens, the text comes back whole), highlights every keyword of the
grammar, is registered as `pygmentize -l fuse`; the VS Code grammar generated from the same
lists is the committed one."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from pygments.token import Comment, Keyword, Name, Number, Token, Whitespace, _TokenType

from fusec.dsl import types as T
from fusec.dsl.highlight import FuseLexer
from fusec.dsl.parse import _parser
from tests.conftest import ROOT
from tests.fuzz.frontend import fuse_sources

SOURCES = [
    ROOT / "kernels.fuse",
    *sorted((ROOT / "tests" / "data").glob("*.fuse")),
    *sorted((ROOT / "tests" / "dsl" / "errors").glob("*.fuse")),
]
# the grammar's keywords, read here independently of dsl/highlight.py
GRAMMAR_KEYWORDS = sorted(
    t.pattern.value
    for t in _parser().terminals
    if type(t.pattern).__name__ == "PatternStr" and t.pattern.value.isidentifier()
)


def _tokens(text: str) -> list[tuple[_TokenType, str]]:
    # no stripping or added newline: the tokens must give back the text exactly
    lexer = FuseLexer(stripnl=False, ensurenl=False)
    return list(lexer.get_tokens(text))


def _assert_covers(text: str) -> None:
    tokens = _tokens(text)
    errors = [(str(ttype), value) for ttype, value in tokens if ttype in Token.Error]
    assert not errors
    assert "".join(value for _, value in tokens) == text


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(ROOT)))
def test_lexes_every_source(path: Path) -> None:
    _assert_covers(path.read_text())


def test_lexes_every_region_of_kernels_alone() -> None:
    text = (ROOT / "kernels.fuse").read_text()
    regions = ["region" + part for part in text.split("\nregion")[1:]]
    assert len(regions) > 20
    for region in regions:
        _assert_covers(region)


def test_every_grammar_keyword_is_highlighted() -> None:
    assert {"region", "const", "in", "layout", "x"} <= set(GRAMMAR_KEYWORDS)
    corpus = {value for path in SOURCES for t, value in _tokens(path.read_text()) if t is Keyword}
    alone = {w for w in GRAMMAR_KEYWORDS if _tokens(w) == [(Keyword, w)]}
    assert [w for w in GRAMMAR_KEYWORDS if w not in corpus | alone] == []
    # `x` is the name of an input vector, a keyword only before a layout's vector width
    assert ("x" in corpus) and ("x" not in alone)
    width = [(Keyword, "x"), (Whitespace, " "), (Number.Integer, "4")]
    assert _tokens("k -> lane x 4")[-3:] == width
    assert _tokens("x[k]")[0] == (Name, "x")


def test_functions_and_dtypes_come_from_the_language() -> None:
    for fn in set(T.FUNCTIONS) | set(T.REDUCERS):
        assert _tokens(f"{fn}(a")[0] == (Name.Builtin, fn)
        assert _tokens(f"{fn} = a")[0] == (Name, fn), "a value named like a function"
    for dtype in T.BUFFER_DTYPES:
        assert _tokens(dtype) == [(Keyword.Type, dtype)]


def test_region_name_and_comment() -> None:
    tokens = _tokens("region scale(x: f32[N]) -> y: f32[N]  # y = x\n")
    assert tokens[:3] == [
        (Keyword, "region"),
        (Whitespace, " "),
        (Name.Function, "scale"),
    ]
    assert (Comment.Single, "# y = x") in tokens


@settings(
    derandomize=True,
    deadline=None,
    database=None,
    max_examples=50,
    phases=[Phase.explicit, Phase.generate],
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(source=fuse_sources())
def test_lexes_generated_sources(source: str) -> None:
    _assert_covers(source)


def _gen_textmate() -> ModuleType:
    spec = importlib.util.spec_from_file_location(
        "gen_textmate", ROOT / "scripts" / "gen_textmate.py"
    )
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_textmate_grammar_is_up_to_date() -> None:
    gen = _gen_textmate()
    assert gen.OUTPUT.read_text() == gen.render(), "run: python scripts/gen_textmate.py"


def test_pygmentize_finds_the_lexer(tmp_path: Path) -> None:
    # run outside the checkout, so that only the installed entry point can find the lexer
    proc = subprocess.run(
        [sys.executable, "-m", "pygments", "-l", "fuse", "-f", "html", str(ROOT / "kernels.fuse")],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    assert '<span class="k">region</span>' in proc.stdout
    assert '<span class="nf">rms_norm_mul_matvec</span>' in proc.stdout


def test_the_vscode_folder_is_a_valid_extension() -> None:
    """package.json against editors/vscode/package.schema.json (the fields VS Code needs to load
    a language and its grammar); every file it names exists and is JSON, and the grammar's scope
    is the one declared."""
    import json

    import jsonschema

    folder = ROOT / "editors" / "vscode"
    package = json.loads((folder / "package.json").read_text())
    schema = json.loads((folder / "package.schema.json").read_text())
    jsonschema.validate(package, schema)
    for lang in package["contributes"]["languages"]:
        assert ".fuse" in lang["extensions"]
        json.loads((folder / lang["configuration"]).read_text())
    for grammar in package["contributes"]["grammars"]:
        assert grammar["language"] in {lang["id"] for lang in package["contributes"]["languages"]}
        tm = json.loads((folder / grammar["path"]).read_text())
        assert tm["scopeName"] == grammar["scopeName"]
        assert tm["patterns"] and tm["repository"]
