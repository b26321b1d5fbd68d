"""A prebuilt folder, validated before any device work: nothing in it is trusted.

Input: a folder (or its manifest.json) that `fusec build` wrote, possibly damaged or edited.
Output: the manifest as records (codegen/manifest_records.py) and the verified bytes of every
SPIR-V module it names, or RuntimeFailure with one sentence saying what is wrong.  Checked:
- manifest.json is a regular file of bounded size holding JSON (no NaN/Infinity) of this
  format (`fusec-manifest/2`), whose `integrity` digest matches its content (an edited
  manifest is refused), that meets the published schema (codegen/manifest.schema.json: a
  missing key or a wrong type is refused) and is consistent (codegen.manifest); the
  checks after the digest hold even for a manifest whose digest was recomputed (the digest is
  not a signature; the folder fuzzer's `reseal` mode);
- every path it names is a plain file name inside the folder, a regular file (not a link, a
  device or a FIFO), of bounded size;
- every `.spv` has the sha256 the manifest records, a SPIR-V header, and declares what the
  manifest says: a GLCompute `main`, the workgroup size, storage buffers only at the manifest's
  bindings of set 0, specialization constants of the manifest's types;
- `spirv-val` (SPIRV-Tools), where it is installed, accepts every module that will run.
Not checked here: that the manifest matches the source it was built from (`Build.check_program`
does that once the source is parsed), and what a valid module computes: its code is trusted
once its declarations agree with the manifest (capabilities and LocalSizeId are not examined;
spirv-val checks the module's validity, not its intent).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import shutil
import stat
import subprocess
from pathlib import Path
from typing import Any

from fusec.codegen import manifest as mf
from fusec.codegen import manifest_kernel as mk
from fusec.codegen import manifest_records as mr
from fusec.codegen import spirv

from .device import RuntimeFailure

MAX_MANIFEST_BYTES = 64 << 20
MAX_SPV_BYTES = 64 << 20
MAX_SOURCE_BYTES = 16 << 20
SPIRV_VAL_TIMEOUT_S = 60
_HINT = "rebuild it with fusec build FILE -o DIR"
_SPEC_TYPES = {"u32": "u32", "i32": "i32", "f32": "f32"}
# a module's float elements tell the buffer's dtype; integer words may pack any dtype
_ELEMENTS = {"f32": "f32", "f16": "f16"}


def _damaged(folder: Path, what: str) -> RuntimeFailure:
    return RuntimeFailure(f"build folder {folder} is damaged: {what}", _HINT)


def _reject_constant(token: str) -> Any:
    raise ValueError(f"{token} is not a JSON number")


def read_regular(folder: Path, name: str, limit: int) -> bytes:
    """The bytes of file `name` inside `folder`: a plain name, a regular file, at most `limit`
    bytes; RuntimeFailure otherwise."""
    if name in ("", ".", "..") or "/" in name or "\\" in name or "\0" in name:
        raise _damaged(folder, f"the manifest names a path outside the folder ({name!r})")
    path = folder / name
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except FileNotFoundError:
        raise _damaged(folder, f"{name} is missing") from None
    except OSError as exc:
        raise _damaged(folder, f"cannot open {name} ({exc.strerror})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise _damaged(folder, f"{name} is not a regular file")
        if st.st_size > limit:
            raise _damaged(folder, f"{name} has {st.st_size} bytes, more than {limit}")
        with os.fdopen(fd, "rb", closefd=False) as f:
            data = f.read(limit + 1)
    finally:
        os.close(fd)
    if len(data) > limit:
        raise _damaged(folder, f"{name} has more than {limit} bytes")
    return data


def load_manifest(path: str | Path) -> tuple[Path, mr.Manifest]:
    """(folder, manifest records) of a build folder, or of its manifest.json, validated: an
    unknown format, an edited manifest, a missing key, a wrong type or an inconsistency is
    refused in one sentence (RuntimeFailure)."""
    p = Path(path)
    if p.is_dir():
        folder, name = p, "manifest.json"
    else:
        folder, name = p.parent, p.name
    try:
        raw = read_regular(folder, name, MAX_MANIFEST_BYTES)
    except RuntimeFailure as exc:
        if not (folder / name).exists():
            raise RuntimeFailure(
                f"cannot read build manifest {folder / name}: no such file",
                "run fusec build FILE -o DIR first",
            ) from None
        raise exc
    try:
        data = json.loads(raw.decode("utf-8"), parse_constant=_reject_constant)
    except RecursionError:
        raise _damaged(folder, f"{name} nests too deeply") from None
    except (ValueError, UnicodeDecodeError) as exc:
        raise _damaged(folder, f"{name} is not valid JSON ({exc})") from None
    if not isinstance(data, dict) or data.get("format") != mf.FORMAT:
        found = data.get("format") if isinstance(data, dict) else None
        raise RuntimeFailure(
            f"{folder / name} is not a {mf.FORMAT} manifest"
            + (f" (it says {found!r})" if isinstance(found, str) else ""),
            _HINT,
        )
    if not mf.is_sealed(data):
        raise _damaged(
            folder, f"{name} was changed after the build (its integrity digest does not match)"
        )
    # the schema's validator, a dependency of fusec: looked up, not imported (0.1 s), since
    # content that passed before skips it (manifest._SchemaMemo)
    if importlib.util.find_spec("jsonschema") is None:
        raise RuntimeFailure(
            "validating a build folder needs the jsonschema package, which is not installed",
            "pip install jsonschema (on an offline machine, bring its wheels with fusec's)",
        )
    m = mf.checked_records(data, sealed=True)
    if isinstance(m, str):
        raise _damaged(folder, f"{name}: {m}")
    read_regular(folder, m.source_copy, MAX_SOURCE_BYTES)  # present and a plain file
    return folder, m


def checked_modules(folder: Path, m: mr.Manifest) -> dict[str, bytes]:
    """The verified bytes of every kernel's SPIR-V, by kernel name (module docstring);
    RuntimeFailure otherwise.  Every module's sha256 is checked on every load; what a module
    declares (reflection, two thirds of `fusec occupancy FILE`'s time) is checked once per
    manifest digest and fusec: modules of the sha256s a manifest of that digest pins, which
    passed before, pass again (a memo in the user's cache folder, as the schema check's)."""
    memo = mf._SchemaMemo.of_digest(m.integrity, _module_check_key(), "validated-modules")
    passed = memo is not None and memo.passed()
    out = {
        k.name: check_module(folder, k, region, declarations=not passed)
        for region in m.regions
        for k in region.kernels()
    }
    if memo is not None and not passed:
        memo.remember()
    return out


@functools.cache
def _module_check_key() -> str:
    """The code that checks a module against its manifest entry, as a name part."""
    h = hashlib.sha256()
    for f in (__file__, spirv.__file__, mr.__file__, mk.__file__):
        h.update(Path(f).read_bytes())
    return h.hexdigest()[:16]


def reflect_compute(
    name: str, spv: bytes, workgroup_size: int, whose: str
) -> spirv.Reflection | str:
    """The reflection of module `name` where it is a GLCompute `main` of `workgroup_size` (or
    of a size it leaves to specialization), else what is wrong with it, for the caller's
    refusal (`whose`: what recorded the size, "the manifest")."""
    try:
        refl = spirv.reflect(spv)
    except ValueError as exc:
        return f"{name} {exc}"
    if (spirv.GLCOMPUTE, "main") not in refl.entry_points:
        return f"{name} has no GLCompute entry point 'main'"
    if refl.local_size is not None and refl.local_size != (workgroup_size, 1, 1):
        return f"{name} declares workgroup size {refl.local_size}, {whose} {workgroup_size}"
    return refl


def check_module(
    folder: Path, kernel: mr.Kernel, region: mr.Region, declarations: bool = True
) -> bytes:
    """The verified bytes of one kernel's SPIR-V (module docstring); RuntimeFailure otherwise.
    `declarations=False`: its sha256 only (`checked_modules` knows the rest passed before)."""
    name = kernel.spv
    spv = read_regular(folder, name, MAX_SPV_BYTES)
    if hashlib.sha256(spv).hexdigest() != kernel.sha256:
        raise _damaged(folder, f"{name} does not have the sha256 its manifest records")
    if not declarations:
        return spv
    refl = reflect_compute(name, spv, kernel.workgroup_size, "the manifest")
    if isinstance(refl, str):
        raise _damaged(folder, refl)
    declared = {b.binding: b for b in kernel.bindings}
    dtypes = {b.name: b.dtype for b in [*region.inputs, *region.intermediates]}
    dtypes.update({b.name: b.dtype for b in region.outputs})
    inputs = {b.name for b in region.inputs}
    for (dset, number), bound in sorted(refl.bindings.items()):
        entry = declared.get(number)
        if dset != 0 or entry is None or not spirv.is_storage_buffer(bound.storage_class):
            raise _damaged(
                folder,
                f"{name} uses binding {number} of set {dset}, which its manifest entry "
                f"does not declare as a storage buffer of set 0",
            )
        buffer, dtype = entry.buffer, dtypes.get(entry.buffer, "u32")
        if bound.writable != entry.writes or (entry.writes and buffer in inputs):
            raise _damaged(
                folder,
                f"{name} {'writes' if bound.writable else 'only reads'} binding {number}, "
                f"which its manifest says {'writes' if entry.writes else 'reads'} "
                f"{'input ' if buffer in inputs else ''}'{buffer}'",
            )
        if _ELEMENTS.get(bound.element, dtype) != dtype:
            raise _damaged(
                folder,
                f"{name} reads binding {number} as {bound.element} elements, but its manifest "
                f"binds {dtype} buffer '{buffer}' there",
            )
    spec = {c.spec_id: _SPEC_TYPES[c.dtype] for c in region.consts if not c.runtime}
    spec.update({d.spec_id: "u32" for d in kernel.derived})
    for spec_id, type_name in sorted(refl.spec_types.items()):
        want = spec.get(spec_id)
        if want is not None and want != type_name:
            raise _damaged(
                folder,
                f"{name} declares specialization constant {spec_id} as {type_name}, the "
                f"manifest as {want}",
            )
    return spv


def spirv_val(folder: Path, name: str, spv: bytes) -> None:
    """Run SPIRV-Tools' validator on a module, where it is installed."""
    tool = shutil.which("spirv-val")
    if tool is None:
        return
    try:
        proc = subprocess.run(
            [tool, "--target-env", "vulkan1.2", "-"],
            input=spv,
            capture_output=True,
            timeout=SPIRV_VAL_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise _damaged(folder, f"spirv-val could not check {name} ({exc})") from None
    if proc.returncode != 0:
        first = (proc.stderr or proc.stdout).decode(errors="replace").strip().splitlines()
        detail = first[0][:200] if first else f"exit {proc.returncode}"
        raise _damaged(folder, f"spirv-val rejects {name}: {detail}")
