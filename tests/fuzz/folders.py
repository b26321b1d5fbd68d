"""Mutated build folders, run through the CLI (`fusec check DIR`): every one must be refused in
one sentence or verified, never crash, hang, run past a buffer or raise an internal error
(issue 13).

`mutate(base, dest, seed)` copies a build folder and damages it in one of many ways, chosen by
the seed: a manifest field changed in type or value, removed, added or swapped; paths pointing
outside the folder or at device files; SPIR-V truncated, flipped, swapped with another kernel's,
replaced by a link, a FIFO or a folder; the source copy edited.  `run_seeds` runs cases in a
child process (python -m tests.fuzz.folders), one after another with one line of JSON each, so
that a crash or a hang is caught by the parent and blamed on its seed.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import queue
import random
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

ODD_STRINGS = [
    "",
    "../source.fuse",
    "/etc/passwd",
    "/dev/zero",
    "glsl",
    ".",
    "x" * 300,
    "n\u00e4me",
    "a/b.spv",
    "manifest.json",
    "\0",
]
ODD_NUMBERS: list[Any] = [0, -1, 1, 2, 3, 7, 1023, 1 << 31, (1 << 32) - 1, 1 << 32, 1 << 64, 0.5]
ODD_NUMBERS += [1e39, -1e39, 1e-45, 65536, 1 << 20, True, False]


def _paths(node: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path (keys and indices) to a node of a JSON tree, the root excluded."""
    stack: list[tuple[tuple[Any, ...], Any]] = [(prefix, node)]
    while stack:
        path, item = stack.pop()
        if path:
            yield path
        if isinstance(item, dict):
            stack += [((*path, k), v) for k, v in item.items()]
        elif isinstance(item, list):
            stack += [((*path, i), v) for i, v in enumerate(item)]


def _get(node: Any, path: tuple[Any, ...]) -> Any:
    for p in path:
        node = node[p]
    return node


def _mutate_value(rng: random.Random, value: Any, spv_names: list[str]) -> Any:
    choice = rng.randrange(10)
    if choice == 0:
        return None
    if choice == 1:
        return rng.choice([[], {}, [value], {"const": "nope"}, "text"])
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        if choice < 5:
            return rng.choice(ODD_NUMBERS)
        return value + rng.choice([-1, 1, 2, 64, -64]) if isinstance(value, int) else value * 2
    if isinstance(value, str):
        if choice < 6 and spv_names:
            return rng.choice(spv_names)
        return rng.choice([*ODD_STRINGS, value + "x", value.upper(), "f64", "u32", "f32", "i32"])
    if isinstance(value, list):
        if not value:
            return [1]
        items = list(value)
        op = rng.randrange(4)
        if op == 0:
            items.pop(rng.randrange(len(items)))
        elif op == 1:
            items.append(rng.choice(items))
        elif op == 2:
            rng.shuffle(items)
        else:
            items = items * 40
        return items
    if isinstance(value, dict):
        d = dict(value)
        if d and rng.random() < 0.5:
            d.pop(rng.choice(sorted(d)))
        else:
            d[rng.choice(["extra", "name", "spv", "const", "op"])] = rng.choice(ODD_NUMBERS)
        return d
    return value


def _mutate_manifest(rng: random.Random, data: dict[str, Any]) -> str:
    spv_names = sorted(
        {k["spv"] for r in data["regions"] for p in ("fused", "unfused") for k in r[p]}
    )
    targeted = rng.random() < 0.4
    if targeted:
        region = rng.choice(data["regions"])
        kernel = rng.choice(region["fused"] + region["unfused"])
        what = rng.randrange(9)
        if what == 0 and region["consts"]:
            c = rng.choice(region["consts"])
            c["dtype"] = rng.choice(["f64", "f32", "u32", "i32"])
            return f"const {c['name']} dtype -> {c['dtype']}"
        if what == 1:
            kernel["spv"] = rng.choice([*spv_names, "/dev/zero", "../x.spv", "missing.spv"])
            return f"kernel {kernel['name']} spv -> {kernel['spv']}"
        if what == 2:
            data["source_copy"] = rng.choice(["/etc/passwd", "../r.fuse", "glsl", "nope"])
            return f"source_copy -> {data['source_copy']}"
        if what == 3 and len(kernel["bindings"]) > 1:
            kernel["bindings"].pop(rng.randrange(len(kernel["bindings"])))
            return f"kernel {kernel['name']}: a binding dropped"
        if what == 4 and len(kernel["bindings"]) > 1:
            a, b = rng.sample(range(len(kernel["bindings"])), 2)
            ba, bb = kernel["bindings"][a], kernel["bindings"][b]
            ba["buffer"], bb["buffer"] = bb["buffer"], ba["buffer"]
            return f"kernel {kernel['name']}: buffers of two bindings swapped"
        if what == 5 and region["consts"]:
            c = rng.choice(region["consts"])
            c["default"] = rng.choice(ODD_NUMBERS)
            return f"const {c['name']} default -> {c['default']}"
        if what == 6:
            buf = rng.choice(region["inputs"] + region["outputs"] + region["intermediates"])
            buf["shape"][0] = rng.choice([1, 0, {"const": "nope"}, 1 << 40, 5])
            return f"buffer {buf['name']} shape[0] -> {buf['shape'][0]}"
        if what == 7:
            kernel["workgroup_size"] = rng.choice([1, 32, 1024, 2048, 0])
            return f"kernel {kernel['name']} workgroup_size -> {kernel['workgroup_size']}"
        kernel["loop_count"] = rng.choice([1 << 30, -1, {"const": "K"}, 5])
        kernel["loop"] = 1
        return f"kernel {kernel['name']} loop_count -> {kernel['loop_count']}"
    paths = list(_paths(data))
    path = rng.choice(paths)
    parent = _get(data, path[:-1])
    op = rng.randrange(6)
    if op == 0 and isinstance(parent, dict):
        del parent[path[-1]]
        return f"deleted {path}"
    if op == 1 and isinstance(parent, list):
        other = rng.randrange(len(parent))
        parent[path[-1]], parent[other] = parent[other], parent[path[-1]]
        return f"swapped {path} with [{other}]"
    parent[path[-1]] = _mutate_value(rng, parent[path[-1]], spv_names)
    return f"changed {path}"


def _mutate_file(rng: random.Random, dest: Path, data: dict[str, Any]) -> str:
    spvs = sorted(dest.glob("*.spv"))
    spv = rng.choice(spvs)
    raw = spv.read_bytes()
    what = rng.randrange(13)
    if what == 0:
        spv.write_bytes(raw[:-4])
        return f"{spv.name} truncated by 4 bytes"
    if what == 1:
        word = rng.randrange(5)
        b = bytearray(raw)
        b[4 * word + rng.randrange(4)] ^= 1 << rng.randrange(8)
        spv.write_bytes(bytes(b))
        return f"{spv.name} header word {word} flipped"
    if what == 2:
        b = bytearray(raw)
        b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
        spv.write_bytes(bytes(b))
        return f"{spv.name} one bit flipped"
    if what == 3:
        other = rng.choice([p for p in spvs if p != spv])
        shutil.copyfile(other, spv)
        return f"{spv.name} replaced by {other.name}"
    if what == 4:
        spv.write_bytes(b"")
        return f"{spv.name} emptied"
    if what == 5:
        spv.unlink()
        spv.symlink_to("/dev/zero")
        return f"{spv.name} -> /dev/zero"
    if what == 6:
        spv.unlink()
        os.mkfifo(spv)
        return f"{spv.name} made a FIFO"
    if what == 7:
        spv.unlink()
        spv.mkdir()
        return f"{spv.name} made a folder"
    if what == 8:
        spv.unlink()
        return f"{spv.name} deleted"
    m = dest / "manifest.json"
    if what == 9:
        text = m.read_bytes()
        m.write_bytes(text[: rng.randrange(len(text))])
        return "manifest.json truncated"
    if what == 10:
        m.write_bytes(rng.choice([b"[" * 100000, b"\xff\xfe{}", b"NaN", b'{"format": NaN}']))
        return "manifest.json garbage"
    src = dest / data["source_copy"]
    text = src.read_text()
    if what == 11:
        src.write_text(text.replace("= 256", "= 4096").replace("f16[", "f32["))
        return "source.fuse edited (a default, a dtype)"
    src.unlink()
    src.symlink_to("/etc/passwd")
    return "source.fuse -> /etc/passwd"


def mutate(base: Path, dest: Path, seed: int, reseal: bool = False) -> str:
    """Copy the build folder `base` to `dest` and damage it; returns what was done.  With
    `reseal`, an edited manifest gets a recomputed integrity digest (an adversary who knows the
    format), so that the checks behind the digest are exercised."""
    from fusec.codegen import manifest as mf

    rng = random.Random(seed)
    shutil.copytree(base, dest, symlinks=True)
    data = json.loads((dest / "manifest.json").read_text())
    if rng.random() < 0.6:
        what = _mutate_manifest(rng, data)
        if reseal:
            data = mf.seal(data) if "format" in data else data
        text = json.dumps(data, indent=1)
        (dest / "manifest.json").write_text(text)
        return what
    return _mutate_file(rng, dest, data)


@attrs.frozen
class Outcome:
    seed: int
    # "verified" | "refused" | "mismatch" (the check caught wrong outputs) | "internal" | "crash"
    # | "hang" | "not one sentence"
    kind: str
    what: str
    detail: str = ""


def _one_sentence(err: str) -> bool:
    lines = err.strip().splitlines()
    return (
        1 <= len(lines) <= 2
        and lines[0].startswith("fusec: error: ")
        and (len(lines) == 1 or lines[1].startswith("  hint: "))
    )


def run_case(base: Path, work: Path, seed: int, reseal: bool = False) -> Outcome:
    """One mutated folder through `fusec check` (in this process)."""
    from fusec.runtime.cli import main

    dest = work / f"case{seed}"
    if dest.exists():
        shutil.rmtree(dest)
    what = mutate(base, dest, seed, reseal)
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = main(["check", str(dest), "--seed", str(seed)])
    shutil.rmtree(dest, ignore_errors=True)
    text = err.getvalue()
    if rc == 0:
        return Outcome(seed, "verified", what)
    if rc == 1 and _one_sentence(text):
        return Outcome(seed, "refused", what, text.strip().splitlines()[0])
    lines = text.strip().splitlines()
    if rc == 1 and lines and all("differs from the reference" in x for x in lines):
        return Outcome(seed, "mismatch", what, lines[0])
    kind = "internal" if "internal error" in text else "not one sentence"
    return Outcome(seed, kind, what, text.strip()[-400:])


def run_seeds(
    base: Path, work: Path, seeds: list[int], timeout_s: float = 60.0, reseal: bool = False
) -> list[Outcome]:
    """Run cases in a child process; a crash or a hang is blamed on the seed that was running,
    and the child is started again after it."""
    results: list[Outcome] = []
    todo = list(seeds)
    while todo:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.fuzz.folders",
                "reseal" if reseal else "plain",
                str(base),
                str(work),
                *map(str, todo),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            text=True,
            cwd=Path(__file__).resolve().parents[2],
        )
        lines: queue.Queue[str] = queue.Queue()

        def pump(stream: Any = proc.stdout, sink: queue.Queue[str] = lines) -> None:
            for line in stream:
                sink.put(line)
            sink.put("")  # end of output

        reader = threading.Thread(target=pump, daemon=True)
        reader.start()
        running: int | None = None
        while True:
            try:
                line = lines.get(timeout=timeout_s)
            except queue.Empty:
                proc.kill()
                proc.wait()
                seed = running if running is not None else todo[0]
                results.append(Outcome(seed, "hang", "", f"no answer within {timeout_s:.0f} s"))
                break
            if not line:
                rc = proc.wait()
                if running is not None:
                    results.append(Outcome(running, "crash", "", f"child exit status {rc}"))
                break
            msg = json.loads(line)
            if "start" in msg:
                running = msg["start"]
            else:
                results.append(Outcome(**msg))
                running = None
        proc.wait()
        reader.join(timeout=10)
        assert proc.stdout is not None
        proc.stdout.close()
        done = {r.seed for r in results}
        todo = [s for s in todo if s not in done]
    return results


def _child(argv: list[str]) -> None:
    reseal, base, work = argv[0] == "reseal", Path(argv[1]), Path(argv[2])
    work.mkdir(parents=True, exist_ok=True)
    for seed in (int(s) for s in argv[3:]):
        print(json.dumps({"start": seed}), flush=True)
        o = run_case(base, work, seed, reseal)
        print(json.dumps(attrs.asdict(o)), flush=True)


if __name__ == "__main__":
    _child(sys.argv[1:])
