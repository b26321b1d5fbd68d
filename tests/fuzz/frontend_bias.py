"""The bias that steers grammar derivations (frontend_grammar.py) toward meaningful sources.

A pure derivation from dsl/fuse.lark parses but almost never checks: names do not resolve,
shapes disagree, no region has a launch shape.  `FuseBias` keeps a little state while the
deriver walks left to right (the region's inputs and outputs with their ranks, the constants its
shapes use, the stages defined so far, the indices in scope) and answers the deriver's questions
from it:

- which alternative (a region's items come in a plan: constants, launch, then stages that end
  by assigning every output; an `access` is more likely where indices are in scope, a `reduce`
  where they are not);
- how many repetitions (an access has as many indices as its buffer has dimensions, a call as
  many arguments as its function takes);
- which text for NAME, INT, FLOAT and the other terminals, by context (a dtype in `type`, a
  launch key in `launch_item`, a declared buffer in `access`, a small pool of index names...).

Now and then (`odd`) it answers with something else on purpose: a keyword, a GLSL reserved
word or a very long name for NAME, an extreme value for a number, a wrong count.  `loose=True`
drops most of the steering (uniform alternatives, names from one flat pool).
"""

from __future__ import annotations

from typing import Any

from fusec.dsl import types

from .frontend_grammar import Bias, Chooser, Frame, Rep, chance, pick, pick_weighted

DTYPES = (
    ("f32", 0.82),
    ("f16", 0.07),
    ("u32", 0.03),
    ("i32", 0.03),
    ("q8_0", 0.03),
    ("q4_0", 0.02),
)
INPUT_NAMES = ("x", "a", "b", "w", "g", "q")
OUTPUT_NAMES = ("y", "z", "o", "out")
STAGE_NAMES = ("t", "u", "v", "s", "e", "m")
INDEX_NAMES = ("i", "j")
BOUND_NAMES = ("k", "l", "c")
LOOSE_NAMES = ("i", "j", "k", "N", "M", "f32", "workgroup", "shared", "lane", "exp", "sum")
DIM_NAMES = (("N", 0.75), ("M", 0.12), ("K", 0.05))
FUNCTIONS = dict(types.FUNCTIONS)  # the language's functions and their arities
FUNCTION_WEIGHTS = tuple(
    (f, 0.02 if f.startswith(("shuffle", "broadcast")) else 0.1) for f in FUNCTIONS
)
# names a target language or our own generated GLSL may also use; a collision is a bug of ours
GLSL_NAMES = (
    "main",
    "float",
    "int",
    "uint",
    "bool",
    "true",
    "shared",
    "buffer",
    "layout",
    "uniform",
    "in",
    "out",
    "inout",
    "input",
    "output",
    "sample",
    "filter",
    "common",
    "partition",
    "active",
    "texture",
    "vec4",
    "mat2",
    "barrier",
    "atomicAdd",
    "subgroupAdd",
    "gl_x",
    "gl_LocalInvocationID",
    "a__b",
    "__",
    "_",
    "acc0",
    "lid",
    "gid",
    "wg",
    "tmp",
    "SPEC",
    "half",
    "double",
    "switch",
    "const",
    "precision",
)
LONG_NAME = "n" * 300
SMALL_FLOATS = ("1.0", "0.5", "2.0", "1e-6", "0.0", "3.0", "0.25", ".5", "4.")
EXTREME_INTS = (
    "0",
    "1",
    "4294967295",
    "4294967296",
    "2147483648",
    "18446744073709551616",
    "99999999999999999999999999",
    "1" + "0" * 400,
    "007",
)
EXTREME_FLOATS = ("1e309", "1e-320", "3.5e38", "3.4028236e38", "1e39", "0.0", "1E+400", "5e-324")


class FuseBias(Bias):
    """Steers a derivation toward regions that check and build; see the module docstring.

    `heat` is how often a choice is wrong on purpose: 0 gives sources meant to be valid, 1 a
    mistake every hundred choices or so."""

    def __init__(self, ch: Chooser, keywords: list[str], heat: float = 0.0, loose: bool = False):
        super().__init__(ch)
        self.loose = loose
        self.heat = 2.0 if loose else heat
        self.odd_names = (*keywords, *GLSL_NAMES, *FUNCTIONS, "sum", LONG_NAME, "N", "i")
        self.regions: list[str] = []
        self.ctx: list[dict[str, Any]] = []  # expression contexts, innermost last
        self.reset_region()

    # --- state ----------------------------------------------------------------------------------
    def reset_region(self) -> None:
        self.inputs: dict[str, int] = {}
        self.outputs: dict[str, int] = {}
        self.dims: list[str] = []  # constants named in shapes, in order of first use
        self.int_consts: list[str] = []
        self.float_consts: list[str] = []
        self.runtime: list[str] = []
        self.stages: dict[str, int] = {}  # name -> rank
        self.assigned: set[str] = set()
        self.items: list[str] = []
        self.stages_left = 0
        self.region_indices: list[str] = []  # per-workgroup or tile indices: in every stage
        self.tile = False
        self.target: str | None = None
        self.target_rank = 0
        self.target_indices: list[str] = []
        self.bound: list[str] = []  # reduction indices open at this point, outermost first
        self.used: set[str] = set()  # indices the stage's value has subscripted so far
        self.reduced: list[str] = []  # indices the stage's value reduced over
        self.pending: list[str] = []  # names a list declaration still has to write
        self.layout_items: list[tuple[str, str]] = []

    def scope(self) -> list[str]:
        return [*self.region_indices, *self.target_indices, *self.bound]

    def readable(self) -> dict[str, int]:
        """Buffers and indexed stages an access may read, with their ranks."""
        found = {**self.inputs, **self.stages}
        return {n: r for n, r in found.items() if r > 0}

    def fresh(self, pool: tuple[str, ...], taken: Any) -> str:
        for n in pool:
            if n not in taken:
                return n
        return f"{pool[0]}{len(taken)}"

    def spice(self, p: float) -> bool:
        """A deliberate mistake, with probability p scaled by the source's heat."""
        return self.heat > 0 and chance(self.ch, min(1.0, p * self.heat))

    def odd_name(self) -> str:
        return str(pick(self.ch, self.odd_names))

    # --- frames -----------------------------------------------------------------------------------
    def enter(self, frame: Frame, parent: Frame | None) -> None:
        if frame.rule == "expr":
            self.ctx.append(self.expr_context(parent))
        elif frame.rule == "region":
            self.reset_region()
        elif frame.rule == "param" and parent is not None:
            frame.data["output"] = parent.rule == "outputs"
        elif frame.rule == "type":
            frame.data["rank"] = pick_weighted(self.ch, ((1, 0.6), (2, 0.25), (0, 0.15)))
            frame.data["param"] = parent
            frame.data["output"] = parent is not None and parent.data.get("output")
        elif frame.rule in ("number", "launch_value") and parent is not None:
            frame.data["parent"] = parent.rule
            frame.data["nth"] = parent.children.get("number", 1) - 1
            frame.data["key"] = parent.data.get("key")
            frame.data["float"] = parent.rule == "value_bound" or (
                parent.rule in ("const_item", "const_range") and parent.data.get("float")
            )
        elif frame.rule == "const_range" and parent is not None:
            frame.data["float"] = parent.data.get("key") in self.float_consts

    def expr_context(self, parent: Frame | None) -> dict[str, Any]:
        """What an expression at this place should look like: its kind, and maybe the one
        atom it should be (`want`)."""
        if parent is None:
            return {"kind": "value"}
        n = parent.children.get("expr", 1) - 1  # which expression of the parent this is
        key = parent.label if parent.rule == "atom" else parent.rule
        if key == "access":
            plan = parent.data.get("indices", [])
            return {"kind": "index", "want": plan[n] if n < len(plan) else None}
        if key == "tindex" and parent.label != "tindex_extent":
            # a left-side index written as an expression: mostly the plain index name
            name = self.fresh(INDEX_NAMES, [*self.target_indices, *self.region_indices])
            self.target_indices.append(name)
            return {"kind": "index", "want": None if self.spice(0.05) else name}
        if key in ("type", "tindex", "per_decl"):
            return {"kind": "shape", "want": None if self.spice(0.05) else self.dim_name()}
        if key == "call":
            fn = parent.data.get("fn")
            if fn == "select" and n == 0:
                return {"kind": "cond"}
            if fn in ("shuffle_xor", "shuffle", "broadcast") and n == 1:
                return {"kind": "count", "want": pick(self.ch, ("1", "2", "4", "8"))}
            return {"kind": "value"}
        if key == "reduce":
            if parent.data.get("extent") and n == 0:
                return {"kind": "extent", "want": self.dim_name()}
            return {"kind": "value"}
        if key == "repeat_block":
            return {"kind": "count", "want": pick(self.ch, ("2", "3", "iters", "N"))}
        if key == "tile_dim":
            return {"kind": "count", "want": pick(self.ch, ("4", "4", "2", "8", "16"))}
        if key == "tile_decl":
            return {"kind": "index"}
        if key == "( expr )" and self.ctx:
            return {"kind": self.ctx[-1]["kind"]}
        return {"kind": "value"}

    def dim_name(self) -> str:
        if self.heat == 0:
            return "N"
        if chance(self.ch, 0.06):
            return str(pick(self.ch, ("4", "16", "32", "64")))
        return str(pick_weighted(self.ch, DIM_NAMES))

    def chosen(self, frame: Frame) -> None:
        rule, label = frame.rule, frame.label
        if rule == "const_decl":
            names = [d for d in self.dims if d[0].isalpha()] or ["N"]
            if chance(self.ch, 0.3):
                names.append("eps")
            if self.tile and "iters" not in names:
                names.append("iters")
            if self.spice(0.05):
                names.append("N")  # declared twice
            self.pending = names
        elif rule == "runtime_decl":
            self.pending = ["pos"]
        elif rule == "launch_decl":
            keys = ["workgroup"]
            if self.tile or chance(self.ch, 0.3):
                keys.append("subgroup")
                if chance(self.ch, 0.3):
                    keys.append("rows_per_subgroup")
            if self.spice(0.05):
                keys = [pick(self.ch, ("subgroup", "rows_per_subgroup", "waves", "workgroup"))]
            self.pending = keys
        elif rule == "tile_decl":
            self.tile = True
        elif rule == "stage":
            self.plan_stage(frame)
        elif rule == "atom" and label == "access":
            self.plan_access(frame)
        elif rule == "atom" and label == "reduce":
            frame.data["extent"] = chance(self.ch, 0.08)
        elif rule == "atom" and label == "call":
            fn = str(pick_weighted(self.ch, FUNCTION_WEIGHTS))
            if not self.tile and fn in ("shuffle_xor", "shuffle", "broadcast"):
                fn = fn if self.spice(0.3) else "exp"
            frame.data["fn"] = fn
        if rule in ("const_decl", "runtime_decl", "launch_decl"):
            frame.data["count"] = len(self.pending)

    def plan_stage(self, frame: Frame) -> None:
        unassigned = [o for o in self.outputs if o not in self.assigned]
        self.stages_left -= 1
        if unassigned and (self.stages_left < len(unassigned) or chance(self.ch, 0.3)):
            name = unassigned[0]
            rank = self.outputs[name]
        elif self.stages and (self.tile or self.spice(0.05)) and chance(self.ch, 0.3):
            name = pick(self.ch, list(self.stages))  # assigned again
            rank = self.stages[name]
        else:
            name = self.fresh(STAGE_NAMES, self.stages)
            rank = pick_weighted(self.ch, ((0, 0.35), (1, 0.5), (2, 0.15)))
            rank = min(rank, max(self.readable().values(), default=0))
        if self.tile and name not in self.outputs:
            rank = 0  # tile values are per lane
        if self.spice(0.03):
            name = self.odd_name() if chance(self.ch, 0.7) else pick(self.ch, [*self.inputs, "x"])
        self.target = name
        self.target_rank = rank
        self.target_indices = []
        self.bound = []
        self.used = set()
        self.reduced = []
        frame.data["name"] = name
        frame.data["output"] = name in self.outputs

    def plan_access(self, frame: Frame) -> None:
        readable = self.readable()
        if not readable or self.spice(0.03):
            name = self.odd_name() if self.spice(0.5) else pick(self.ch, [*self.inputs, "x"])
            rank = 1
        else:
            need = len([i for i in (*self.target_indices, *self.bound[-1:]) if i not in self.used])
            fits = [n for n, r in readable.items() if r == need] or list(readable)
            name = pick(self.ch, fits if chance(self.ch, 0.8) else list(readable))
            rank = readable[name]
        frame.data["name"] = name
        frame.data["rank"] = rank
        frame.data["indices"] = self.plan_indices(rank)

    def plan_indices(self, rank: int) -> list[str]:
        """Index names for an access of this rank: the innermost reduction index not yet used,
        the stage's indices not yet used, then the rest, in scope order."""
        order = self.scope()
        first = [b for b in reversed(self.bound) if b not in self.used][:1]
        first += [i for i in (*self.region_indices, *self.target_indices) if i not in self.used]
        chosen = first[:rank]
        chosen += [i for i in order if i not in chosen][: rank - len(chosen)]
        chosen.sort(key=order.index)
        if len(chosen) < rank:
            chosen += ["0"] * (rank - len(chosen))
        self.used.update(chosen)
        if self.spice(0.1):
            chosen.reverse()
        return chosen

    def exit(self, frame: Frame) -> None:
        rule = frame.rule
        if rule == "expr":
            self.ctx.pop()
        elif rule == "type" and frame.data["param"] is not None:
            frame.data["param"].data["rank"] = frame.data["rank"]
        elif rule == "param":
            rank = frame.data.get("rank", 0)
            name = frame.data.get("name", "?")
            (self.outputs if frame.data["output"] else self.inputs)[name] = rank
        elif rule == "stage":
            name = frame.data["name"]
            if frame.data["output"]:
                self.assigned.add(name)
            elif name not in self.inputs:
                self.stages[name] = self.target_rank
            self.target_indices = []
            self.target = None
        elif rule == "atom" and frame.label == "reduce":
            if self.bound:
                self.reduced.append(self.bound.pop())
        elif rule == "region":
            self.reset_region()

    # --- alternatives -----------------------------------------------------------------------------
    def alt_weights(self, frame: Frame, labels: list[str]) -> list[float] | None:
        if self.loose:
            return None
        rule = frame.rule
        table: dict[str, float] | None = None
        if rule == "item":
            table = {self.items.pop(0) if self.items else "stage": 1.0}
        elif rule == "top":  # regions; `instance` lines only now and then
            table = {"region": 1.0, "instance_decl": 0.0}
        elif rule == "outputs":
            table = {"param": 0.8, "(": 0.2}
        elif rule == "value_bound":
            table = {"negative": 0.5, "number": 0.5}
        elif rule == "tindex":  # an index name, with an extent now and then
            table = {"tindex_extent": 0.05, "expr": 0.95}
        elif rule == "launch_value":
            key = frame.data.get("key", "workgroup")
            table = {
                "workgroup": {"launch_int": 1.0},
                "subgroup": {"launch_any": 0.5, "launch_at_least": 0.3, "launch_int": 0.1},
                "rows_per_subgroup": {"launch_int": 1.0},
            }.get(key, {"launch_int": 1.0})
            if self.tile and key == "subgroup":
                table = {"launch_at_least": 1.0}
        elif rule == "number":
            in_expr = frame.data.get("parent") == "atom"
            kind = self.ctx[-1]["kind"] if self.ctx and in_expr else "count"
            if frame.data.get("float") or kind == "value":
                table = {"int_lit": 0.1 + 0.2 * min(1.0, self.heat), "float_lit": 0.9}
            else:
                table = {"int_lit": 1.0}
        elif rule in ("disjunction", "conjunction", "sum", "product", "unary", "atom"):
            table = self.expr_weights(rule)
        if table is None:
            return None
        weights = [table.get(label, table.get(label.split()[0], 0.0)) for label in labels]
        if self.spice(0.01) or not any(weights):
            return [w + 0.05 for w in weights]
        return weights

    def expr_weights(self, rule: str) -> dict[str, float] | None:
        ctx: dict[str, Any] = self.ctx[-1] if self.ctx else {"kind": "value"}
        kind = ctx["kind"]
        direct = ctx.get("want") is not None and not ctx.get("spent")
        nesting = len(self.ctx)
        grow = 0.35 / nesting
        # `&&`, `||` and `!` in values now and then (they make 1.0 or 0.0), rarely elsewhere
        logic = 0.0 if direct else (0.04 if kind in ("value", "cond") else 0.005)
        if rule == "disjunction":
            return {"conjunction": 1.0, "logic": logic}
        if rule == "conjunction":
            return {"compare": 1.0, "logic": logic}
        if rule == "sum":
            return {"product": 1.0, "binop": 0.0 if direct else grow}
        if rule == "product":
            return {"unary": 1.0, "binop": 0.0 if direct else grow}
        if rule == "unary":
            return {"atom": 1.0, "neg": 0.0 if direct else 0.04, "logic_not": logic / 2}
        if direct:
            return {"number": 1.0} if ctx["want"][0].isdigit() else {"name": 1.0}
        if kind == "value":
            readable = bool(self.readable())
            unused_bound = any(b not in self.used for b in self.bound)
            unused = any(i not in self.used for i in (*self.target_indices, *self.bound))
            if unused_bound and readable:
                return {"access": 1.0, "call": 0.1 / nesting}
            reduce = (0.45 if not self.scope() else 0.12) / nesting if readable else 0.0
            return {
                "number": 0.04 if unused and readable else 0.12,
                "name": 0.04 if unused and readable else 0.15,
                "access": (0.8 if unused else 0.45) if readable else 0.0,
                "call": 0.18 / nesting,
                "reduce": reduce,
                "( expr )": 0.04,
            }
        if kind == "cond":
            return {"number": 0.2, "name": 0.5, "access": 0.3 if self.readable() else 0.0}
        if kind in ("index", "shape", "extent", "count"):
            return {"number": 0.4, "name": 0.6, "( expr )": 0.03}
        return None

    # --- repetitions ----------------------------------------------------------------------------
    def rep_count(self, frame: Frame, rep: Rep) -> int | None:
        rule, label, n = frame.rule, frame.label, frame.reps
        ch = self.ch
        if self.spice(0.005):
            return None  # the grammar's own count
        if rule == "start":
            if n == 0:
                return 0 if chance(ch, 0.85) else 1
            if n == 1:
                return pick_weighted(ch, ((1, 0.8), (2, 0.15), (0, 0.01), (3, 0.04)))
            return 1
        if self.loose:
            return None
        if rule == "region":
            return self.plan_items()
        if rule == "region_name":  # dtype parameters only now and then
            return int(self.spice(0.02))
        if rule == "params":
            table = ((1, 0.45), (2, 0.35), (3, 0.15), (0, 0.05))
            if "count" not in frame.data:
                frame.data["count"] = pick_weighted(ch, table)
            count = frame.data["count"]
            return (1 if count else 0, count - 1, int(chance(ch, 0.03)))[min(n, 2)]
        if rule == "outputs":
            if "count" not in frame.data:
                frame.data["count"] = pick_weighted(ch, ((1, 0.8), (2, 0.2)))
            return frame.data["count"] - 1 if n == 0 else int(chance(ch, 0.03))
        if rule == "param":
            if n == 0:  # `state`
                return int(self.spice(0.05))
            return int(self.spice(0.05) if frame.data["output"] else chance(ch, 0.05))
        if rule == "type":
            rank = frame.data["rank"]
            return (1 if rank else 0) if n == 0 else rank - 1
        if rule in ("const_decl", "runtime_decl", "launch_decl"):
            return max(0, frame.data["count"] - 1)
        if rule == "const_item":
            return int(chance(ch, 0.12) and (frame.data.get("key") != "eps" or self.spice(0.5)))
        if rule == "budget_decl":
            return 0
        if rule == "budget_item":
            return int(chance(ch, 0.3))
        if rule == "launch_value":
            return int(label != "launch_at_least" or chance(ch, 0.6))
        if rule == "tile_decl":
            return (1, int(chance(ch, 0.2)), int(chance(ch, 0.8)))[min(n, 2)]
        if rule == "repeat_block":
            self.stages_left += 1
            return 1 + int(chance(ch, 0.4))
        if rule == "stage":
            rank = self.target_rank
            if n == 0:  # a mask (`where ...`): rarely
                return int(self.spice(0.02))
            if n == 1:  # placement
                return int(chance(ch, 0.25 if rank < 2 and not frame.data["output"] else 0.0))
            layout = self.layout_plan()
            frame.data["layout"] = layout
            return int(bool(layout))
        if rule == "placement":
            return int(self.spice(0.1))
        if rule == "target":
            rank = self.target_rank
            return (1 if rank else 0) if n == 0 else rank - 1
        if rule == "tindex":
            return int(chance(ch, 0.05))
        if rule == "layout":
            return len(self.layout_items) - 1
        if rule == "layout_item":
            return int(frame.data.get("unit") == "lane" and chance(ch, 0.6))
        if rule == "compare":
            kind = self.ctx[-1]["kind"] if self.ctx else "value"
            return int(chance(ch, 0.9) if kind == "cond" else self.spice(0.02))
        if rule == "atom" and label == "access":
            return max(0, frame.data["rank"] - 1)
        if rule == "atom" and label == "call":
            arity = FUNCTIONS.get(frame.data.get("fn", ""), 1)
            if self.spice(0.03):
                arity = ch.below(4)
            return (1 if arity else 0) if n == 0 else max(0, arity - 1)
        if rule == "atom" and label == "reduce":
            if n == 0:
                return int(frame.data["extent"])
            return int(chance(ch, 0.6))
        return None

    def layout_plan(self) -> list[tuple[str, str]]:
        """`layout i -> subgroup, k -> lane` for a one-index stage that reduced, sometimes."""
        items: list[tuple[str, str]] = []
        if self.target_indices and self.reduced and chance(self.ch, 0.3):
            items = [(self.target_indices[0], "subgroup"), (self.reduced[-1], "lane")]
        elif self.spice(0.05):
            items = [(pick(self.ch, self.scope() or ["i"]), "lane")]
        self.layout_items = list(items)
        return items

    def plan_items(self) -> int:
        ch = self.ch
        items: list[str] = []
        if not self.spice(0.05):
            items.append("const_decl")
        if chance(ch, 0.05):
            items.append("runtime_decl")
        if not self.spice(0.04):
            items.append("launch_decl")
        if chance(ch, 0.04):
            items.append("budget_decl")
        if chance(ch, 0.04):
            items.append("per_decl")
        elif chance(ch, 0.03):
            items.append("tile_decl")
        stages = max(len(self.outputs), 1) + pick_weighted(ch, ((0, 0.4), (1, 0.35), (2, 0.25)))
        if self.spice(0.03):
            stages = max(0, stages - 1)
        body = ["stage"] * stages
        if ("tile_decl" in items and chance(ch, 0.5)) or self.spice(0.02):
            body.insert(ch.below(len(body) + 1), "repeat_block")
        items += body
        if self.spice(0.05) and len(items) > 1:
            i, j = ch.below(len(items)), ch.below(len(items))
            items[i], items[j] = items[j], items[i]
        self.items = list(items)
        self.stages_left = stages
        return len(items)

    # --- terminals --------------------------------------------------------------------------------
    def terminal(self, frame: Frame, name: str) -> str | None:
        if name == "NAME":
            text = self.name(frame)
            if frame.rule == "param" and frame.names == 0:
                frame.data["name"] = text
            return text
        if name == "INT":
            return self.int_text(frame)
        if name == "FLOAT":
            if self.spice(0.05):
                return str(pick(self.ch, EXTREME_FLOATS))
            return str(pick(self.ch, SMALL_FLOATS))
        if name == "REDUCER":
            return str(pick_weighted(self.ch, (("sum", 0.6), ("max", 0.2), ("min", 0.2))))
        if name == "COMPOP":
            if frame.rule == "per_decl" or (frame.label == "reduce" and not self.spice(0.1)):
                return "<"
            if frame.rule == "budget_item":
                return ">=" if frame.data.get("key") == "waves" else "<="
            return str(pick(self.ch, ("<", "<=", ">", ">=", "==", "!=")))
        if name == "STATE":
            return "state"
        kind = self.ctx[-1]["kind"] if self.ctx else "value"
        if name == "MULOP":
            modulo = 0.3 if kind != "value" else (0.1 if self.heat else 0.0)
            return str(pick_weighted(self.ch, (("*", 0.6), ("/", 0.3), ("%", modulo))))
        if name == "ADDOP":
            return str(pick_weighted(self.ch, (("+", 0.6), ("-", 0.4))))
        return None

    def name(self, frame: Frame) -> str:
        ch = self.ch
        if self.spice(0.01):
            return self.odd_name()
        rule, label, n = frame.rule, frame.label, frame.names
        if self.loose:
            return str(
                pick(
                    ch,
                    (*INPUT_NAMES[:3], *OUTPUT_NAMES[:2], *STAGE_NAMES[:2], *LOOSE_NAMES),
                )
            )
        if rule == "region_name" and n == 0:
            name = self.fresh(("r", "r2", "r3"), self.regions)
            if self.spice(0.05) and self.regions:
                name = self.regions[0]
            self.regions.append(name)
            return name
        if rule == "param":
            taken = {**self.inputs, **self.outputs}
            pool = OUTPUT_NAMES if frame.data["output"] else INPUT_NAMES
            if self.spice(0.03):
                return str(pick(ch, [*taken, "x"]))
            return self.fresh(pool, taken)
        if rule == "type":
            if frame.data["output"] and not self.spice(0.2):
                return "f32" if chance(ch, 0.9) else "f16"
            if self.heat == 0:
                return str(pick_weighted(ch, (("f32", 0.9), ("f16", 0.1))))
            return str(pick_weighted(ch, DTYPES))
        if rule in ("const_item", "runtime_item", "launch_item"):
            name = self.pending.pop(0) if self.pending else "N"
            frame.data["key"] = name
            frame.data["float"] = name == "eps"
            if rule == "const_item":
                (self.float_consts if name == "eps" else self.int_consts).append(name)
            elif rule == "runtime_item":
                self.runtime.append(name)
            return name
        if rule == "launch_value":
            return "shared"
        if rule == "budget_item":
            if n == 0:
                key = str(pick(ch, ("waves", "vgprs", "spills")))
                frame.data["key"] = key
                return key
            return str(pick(ch, ("gfx1201", "navi31", "sm90", "navi21")))
        if rule == "per_decl":
            if n == 0:
                return "workgroup"
            self.region_indices.append("h")
            return "h"
        if rule == "tile_dim":
            name = self.fresh(("src", "dst", "e3"), self.region_indices)
            self.region_indices.append(name)
            return name
        if rule == "tile_decl":
            self.region_indices.append("t")
            return "t"
        if rule == "target":
            return self.target or "t"
        if rule == "tindex":
            name = self.fresh(INDEX_NAMES, [*self.target_indices, *self.region_indices])
            self.target_indices.append(name)
            return name
        if rule == "placement":
            if n == 0:
                table = (("shared", 0.6), ("global", 0.25), ("register", 0.15))
                extra = (("slices", 0.1 * self.heat), ("grid", 0.1 * self.heat))
                return str(pick_weighted(ch, (*table, *extra)))
            return "q8_0"
        if rule == "layout_item":
            index, unit = self.layout_items[0] if self.layout_items else ("i", "lane")
            frame.data["unit"] = unit
            if n == 1:
                if self.layout_items:
                    self.layout_items.pop(0)
                return unit
            return index
        if rule == "scope":
            if self.target_rank > 0 or self.region_indices:
                return str(pick(ch, ("subgroup", "lane")))
            return str(pick_weighted(ch, (("workgroup", 0.4), ("subgroup", 0.3), ("lane", 0.3))))
        if rule == "atom" and label == "access":
            return str(frame.data["name"])
        if rule == "atom" and label == "call":
            return str(frame.data["fn"])
        if rule == "atom" and label == "reduce":
            name = self.fresh(BOUND_NAMES, [*self.scope(), *self.reduced])
            self.bound.append(name)
            return name
        if rule == "atom" and label == "name":
            return self.expr_name()
        return str(pick(ch, ("x", "i", "N")))

    def expr_name(self) -> str:
        ch = self.ch
        ctx: dict[str, Any] = self.ctx[-1] if self.ctx else {"kind": "value"}
        want = ctx.get("want")
        kind = ctx["kind"]
        if want is not None and not ctx.get("spent"):
            ctx["spent"] = True
            if kind in ("shape", "extent") and want[0].isalpha() and want not in self.dims:
                self.dims.append(want)
            return str(want)
        if kind == "shape":
            name = self.dim_name()
            if name[0].isalpha() and name not in self.dims:
                self.dims.append(name)
            return name
        groups: list[tuple[list[str], float]] = []
        if kind in ("index", "cond", "count", "extent"):
            groups = [(self.scope(), 0.6), (self.int_consts, 0.3), (self.runtime, 0.1)]
        else:
            scalars = [s for s, r in self.stages.items() if r == 0]
            groups = [
                (scalars, 0.4),
                (self.float_consts, 0.3),
                (self.scope(), 0.1),
                (self.int_consts, 0.1),
                (self.runtime, 0.1),
            ]
        groups = [(g, w) for g, w in groups if g]
        if not groups:
            return str(pick(ch, ("N", "i", "x")))
        chosen: list[str] = pick_weighted(ch, groups)
        name = str(pick(ch, chosen))
        self.used.add(name)
        return name

    def int_text(self, frame: Frame) -> str:
        ch = self.ch
        if self.spice(0.04):
            return str(pick(ch, EXTREME_INTS))
        rule = frame.rule
        if rule == "launch_value":
            key = frame.data.get("key")
            if key == "subgroup":
                return str(pick(ch, ("16", "32", "4", "8", "64")))
            if key == "rows_per_subgroup":
                return str(pick(ch, ("1", "2", "4")))
            sizes = (("64", 0.4), ("256", 0.25), ("128", 0.15), ("32", 0.1), ("1024", 0.05))
            return str(pick_weighted(ch, sizes))
        if rule == "layout_item":
            return str(pick(ch, ("4", "1", "2", "8")))
        parent = frame.data.get("parent")
        if parent == "const_item":
            defaults = (
                ("64", 0.3),
                ("16", 0.2),
                ("128", 0.15),
                ("4", 0.15),
                ("1", 0.05),
                ("256", 0.1),
            )
            return str(pick_weighted(ch, defaults))
        if parent == "const_range":
            first = frame.data.get("nth", 0) == 0
            return str(pick(ch, ("1", "1", "4") if first else ("4096", "65536", "1024")))
        if parent == "budget_item":
            key = frame.data.get("key")
            if key == "waves":
                return str(pick(ch, ("1", "2", "4", "8")))
            return str(pick(ch, ("128", "256", "64", "0")))
        ctx: dict[str, Any] = self.ctx[-1] if self.ctx else {"kind": "count"}
        want = ctx.get("want")
        if want is not None and want.isdigit() and not ctx.get("spent"):
            ctx["spent"] = True
            return str(want)
        kind = ctx["kind"]
        if kind in ("index", "cond"):
            return str(pick(ch, ("0", "1", "2", "3")))
        if kind in ("shape", "extent"):
            return str(pick(ch, ("4", "16", "32", "64", "2")))
        return str(pick(ch, ("1", "2", "3", "4", "0", "8")))
