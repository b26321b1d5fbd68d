"""What `fusec tune --from-json FILE --write` reads of a `fusec tune --json` result, as a JSON
Schema (validated with jsonschema): the instance tuned, the target its lines are for, and the
candidates' schedules, the baseline among them.  A record that does not hold to it is "no
`fusec tune --json` result" in one sentence (runtime/tune_cmd.py); the rest of the record is
for people.
"""

from __future__ import annotations

from typing import Any

_SCHEDULE: dict[str, Any] = {
    "type": "object",
    "required": ["workgroup", "rows_per_subgroup", "layouts"],
    "properties": {
        "workgroup": {"type": "integer", "minimum": 1},
        "rows_per_subgroup": {"type": ["integer", "null"], "minimum": 1},
        "layouts": {
            "type": "array",
            "items": {
                "type": "object",
                "required": ["stage", "rows", "vector"],
                "properties": {
                    "stage": {"type": "string"},
                    "rows": {"type": "string"},
                    "vector": {"type": "integer", "minimum": 1},
                },
            },
        },
    },
}
RESULT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["region", "lines_for", "candidates"],
    "properties": {
        "region": {"type": "string"},
        "instance": {"type": ["string", "null"]},
        "lines_for": {"type": "string"},
        "comment": {"type": ["string", "null"]},
        "candidates": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "object",
                "required": ["schedule", "baseline"],
                "properties": {"schedule": _SCHEDULE, "baseline": {"type": "boolean"}},
            },
            "contains": {"type": "object", "properties": {"baseline": {"const": True}}},
        },
    },
}
