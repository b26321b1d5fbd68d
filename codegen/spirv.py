"""What a SPIR-V module declares, read from its binary: the facts a runtime must agree with.

Input: the bytes of a `.spv` file, untrusted.  Output: a `Reflection` (entry point, local size,
storage-buffer bindings, specialization constants and their types), or ValueError with one
sentence when the bytes are not a well-formed SPIR-V module.  Pure data: no shaderc, no Vulkan,
so the runtime can use it on a prebuilt folder.

Opcodes and enumerants are from the SPIR-V specification (Khronos, "SPIR-V Specification",
version 1.6, sections 2.3 "Physical Layout" and 3 "Binary Form").  This does not check that
the module is valid beyond its structure: that is spirv-val's job (runtime/prebuilt.py runs it
where it is installed).
"""

from __future__ import annotations

import struct

import attrs

MAGIC = 0x07230203
MAX_VERSION = 0x00010600  # SPIR-V 1.6

_OP_NAME = {  # the opcodes we read
    "EntryPoint": 15,
    "ExecutionMode": 16,
    "TypeBool": 20,
    "TypeInt": 21,
    "TypeFloat": 22,
    "TypeVector": 23,
    "TypeRuntimeArray": 29,
    "TypeStruct": 30,
    "TypePointer": 32,
    "SpecConstantTrue": 48,
    "SpecConstantFalse": 49,
    "SpecConstant": 50,
    "Variable": 59,
    "Decorate": 71,
    "MemberDecorate": 72,
}
_EXECUTION_MODEL_GLCOMPUTE = 5
_EXECUTION_MODE_LOCAL_SIZE = 17
_DECORATION_SPEC_ID = 1
_DECORATION_NON_WRITABLE = 24
_DECORATION_NON_READABLE = 25
_DECORATION_BINDING = 33
_DECORATION_DESCRIPTOR_SET = 34
_STORAGE_CLASS_UNIFORM = 2
_STORAGE_CLASS_STORAGE_BUFFER = 12


@attrs.frozen
class Binding:
    """A variable at a descriptor binding: its storage class, the scalar type of its runtime
    array's elements ("f32", "f16", "u32", ... or "unknown"), and whether the shader may write
    or read it (SPIR-V NonWritable / NonReadable on the block's member or the variable)."""

    storage_class: int
    element: str
    writable: bool
    readable: bool


@attrs.frozen
class Reflection:
    """What the module declares.  `spec_types` maps a SpecId to "u32", "i32", "f32", "bool" or
    another type's description; `bindings` maps (set, binding) to what is bound there."""

    version: int
    entry_points: tuple[tuple[int, str], ...]  # (execution model, name)
    local_size: tuple[int, int, int] | None
    bindings: dict[tuple[int, int], Binding]
    spec_types: dict[int, str]


def _string(words: tuple[int, ...]) -> str:
    raw = b"".join(struct.pack("<I", w) for w in words)
    return raw.split(b"\0", 1)[0].decode("utf-8", "replace")


def header_problem(spv: bytes) -> str | None:
    """What is wrong with the module's header (size, magic number, version, schema word), as
    the end of a sentence about the module; None when it is a SPIR-V header."""
    if len(spv) < 20 or len(spv) % 4:
        return f"is {len(spv)} bytes, not a whole number of 32-bit words of SPIR-V"
    magic, version, _, _, schema = struct.unpack("<5I", spv[:20])
    if magic != MAGIC:
        return "does not start with the SPIR-V magic number"
    if version & 0xFF0000FF or not 0x00010000 <= version <= MAX_VERSION:
        return f"declares SPIR-V version {version:#010x}, not 1.0 .. 1.6"
    if schema != 0:
        return "has a non-zero schema word in its header"
    return None


def reflect(spv: bytes) -> Reflection:
    """Walk the instruction stream (every word count bounds-checked) and collect the facts."""
    problem = header_problem(spv)
    if problem is not None:
        raise ValueError(problem)
    words = struct.unpack(f"<{len(spv) // 4}I", spv)
    version = words[1]
    bound = words[3]
    entry_points: list[tuple[int, str]] = []
    local_size: tuple[int, int, int] | None = None
    decorations: dict[int, dict[int, int]] = {}
    variables: dict[int, tuple[int, int]] = {}  # id -> (pointer type, storage class)
    pointers: dict[int, int] = {}  # pointer type -> pointee
    structs: dict[int, tuple[int, ...]] = {}  # struct type -> member types
    arrays: dict[int, int] = {}  # runtime array / vector type -> element type
    member_decorations: dict[tuple[int, int], set[int]] = {}
    types: dict[int, str] = {}
    spec_consts: dict[int, int] = {}  # id -> type id
    i = 5
    while i < len(words):
        count, opcode = words[i] >> 16, words[i] & 0xFFFF
        if count == 0 or i + count > len(words):
            raise ValueError(f"has a malformed instruction at word {i}")
        ops = words[i + 1 : i + count]
        if opcode == _OP_NAME["EntryPoint"] and len(ops) >= 3:
            entry_points.append((ops[0], _string(ops[2:])))
        elif opcode == _OP_NAME["ExecutionMode"] and len(ops) >= 5:
            if ops[1] == _EXECUTION_MODE_LOCAL_SIZE:
                local_size = (ops[2], ops[3], ops[4])
        elif opcode == _OP_NAME["Decorate"] and len(ops) >= 2:
            value = ops[2] if len(ops) >= 3 else 0
            decorations.setdefault(ops[0], {})[ops[1]] = value
        elif opcode == _OP_NAME["MemberDecorate"] and len(ops) >= 3:
            member_decorations.setdefault((ops[0], ops[1]), set()).add(ops[2])
        elif opcode == _OP_NAME["Variable"] and len(ops) >= 3:
            variables[ops[1]] = (ops[0], ops[2])
        elif opcode == _OP_NAME["TypePointer"] and len(ops) >= 3:
            pointers[ops[0]] = ops[2]
        elif opcode == _OP_NAME["TypeStruct"] and ops:
            structs[ops[0]] = tuple(ops[1:])
        elif opcode in (_OP_NAME["TypeRuntimeArray"], _OP_NAME["TypeVector"]) and len(ops) >= 2:
            arrays[ops[0]] = ops[1]
        elif opcode == _OP_NAME["TypeInt"] and len(ops) >= 3:
            types[ops[0]] = f"{'i' if ops[2] else 'u'}{ops[1]}"
        elif opcode == _OP_NAME["TypeFloat"] and len(ops) >= 2:
            types[ops[0]] = f"f{ops[1]}"
        elif opcode == _OP_NAME["TypeBool"] and ops:
            types[ops[0]] = "bool"
        elif (
            opcode
            in (
                _OP_NAME["SpecConstant"],
                _OP_NAME["SpecConstantTrue"],
                _OP_NAME["SpecConstantFalse"],
            )
            and len(ops) >= 2
        ):
            spec_consts[ops[1]] = ops[0]
        i += count
    if any(ident >= bound for ident in [*variables, *spec_consts]):
        raise ValueError("uses an id past the bound its header declares")
    bindings = {}
    for var, (pointer, storage) in variables.items():
        deco = decorations.get(var, {})
        if _DECORATION_BINDING not in deco:
            continue
        block = pointers.get(pointer, -1)
        members = structs.get(block, ())
        element = arrays.get(members[0], -1) if members else -1
        element = arrays.get(element, element)  # a vector's component
        member = member_decorations.get((block, 0), set())
        bindings[(deco.get(_DECORATION_DESCRIPTOR_SET, 0), deco[_DECORATION_BINDING])] = Binding(
            storage,
            types.get(element, "unknown"),
            _DECORATION_NON_WRITABLE not in member and _DECORATION_NON_WRITABLE not in deco,
            _DECORATION_NON_READABLE not in member and _DECORATION_NON_READABLE not in deco,
        )
    spec_types = {}
    for const, type_id in spec_consts.items():
        deco = decorations.get(const, {})
        if _DECORATION_SPEC_ID in deco:
            spec_types[deco[_DECORATION_SPEC_ID]] = types.get(type_id, "unknown")
    return Reflection(version, tuple(entry_points), local_size, bindings, spec_types)


def is_storage_buffer(storage_class: int) -> bool:
    """StorageBuffer, or Uniform with BufferBlock (SPIR-V 1.0 modules)."""
    return storage_class in (_STORAGE_CLASS_STORAGE_BUFFER, _STORAGE_CLASS_UNIFORM)


GLCOMPUTE = _EXECUTION_MODEL_GLCOMPUTE
