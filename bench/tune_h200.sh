#!/usr/bin/env bash
# Tune the decode layer's regions on the present GPU (the H200: target sm90) for f16 and q4_0
# weights, write the table and every run's JSON, and write nothing into kernels.fuse.
#
#   OUT=/tmp/out bash bench/tune_h200.sh
#
# Run from the repository root with `python3 -m fusec` working (PYTHONPATH set, fusec/_shaderc*.so
# there), or with KEEP=DIR naming a `fusec tune --keep` folder whose candidates were built
# elsewhere (the run then loads them instead of compiling).  Settings, from the environment:
#   OUT      where the results go (default ./tune-out): tune_h200.md, tune_h200.json and
#            json-<weights>/<instance>_<shape>.json, one `fusec tune --json` result per call
#   PRESET   the layer's shapes (default qwen3-8b; tiny for a test on lavapipe)
#   WEIGHTS  the layer weight dtypes (default "f16 q4_0")
#   MAXC     candidates per call, the baseline among them (default 12: about 8 minutes in all)
#   PER_CALL seconds one call may take before it is given up (default 60)
#   KEEP     a --keep folder of candidate builds (default: $OUT/keep, kept for a second run)
#   EXTRA    further `fusec tune` arguments (lavapipe: "--target sm90 --time --reps 2")
#   PYTHON   the interpreter (default python3)
#
# Writing the winners afterwards, on a machine with this checkout (each checked against the
# instance's schedule in kernels.fuse, which must still be the run's baseline):
#   for f in OUT/json-*/*.json; do python3 -m fusec tune kernels.fuse --from-json "$f" --write; done
# (a region called at two shapes, e.g. matvec_add<q4_0> at K=4096 and K=12288, has two results
# for one instance: write the one you want; the second replaces the first's lines.)
set -euo pipefail
OUT=${OUT:-./tune-out}
PRESET=${PRESET:-qwen3-8b}
WEIGHTS=${WEIGHTS:-"f16 q4_0"}
MAXC=${MAXC:-12}
PER_CALL=${PER_CALL:-60}
KEEP=${KEEP:-$OUT/keep}
EXTRA=${EXTRA:-}
PYTHON=${PYTHON:-python3}
mkdir -p "$OUT" "$KEEP"
start=$(date +%s)
: > "$OUT/tune_h200.md"
for w in $WEIGHTS; do
    # shellcheck disable=SC2086  # EXTRA is a list of arguments
    "$PYTHON" bench/tune_layer.py --preset "$PRESET" --weights "$w" --timeout "$PER_CALL" \
        -o "$OUT/tune_$w.md" --json "$OUT/tune_$w.json" --json-dir "$OUT/json-$w" \
        -- --max-candidates "$MAXC" --keep "$KEEP" $EXTRA
    cat "$OUT/tune_$w.md" >> "$OUT/tune_h200.md"
    echo >> "$OUT/tune_h200.md"
done
"$PYTHON" - "$OUT" $WEIGHTS <<'PY'
import json, sys
from pathlib import Path
out = Path(sys.argv[1])
merged = {w: json.loads((out / f"tune_{w}.json").read_text()) for w in sys.argv[2:]}
(out / "tune_h200.json").write_text(json.dumps(merged, indent=1))
PY
echo "tune_h200.sh: $(( $(date +%s) - start )) s; results in $OUT" >&2
