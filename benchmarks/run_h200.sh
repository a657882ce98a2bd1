#!/usr/bin/env bash
# One device session on the lent H200: doctor, selftest, bench, (tune).
# Usage (device tool): bash benchmarks/run_h200.sh PHASE...   phases: check bench tune sanitize
# Everything lands in $OUT (log, JSON, PNG, tuned JSON lines).
set -uo pipefail
export PYTHONPATH="$PWD/src${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 COLUMNS=160
export OPFORGE_CACHE_DIR="${OPFORGE_CACHE_DIR:-/tmp/opforge-cache}"
OUT="${OUT:-/tmp/out}"; mkdir -p "$OUT"
stamp=$(date +%Y-%m-%d)
for phase in "$@"; do
  case "$phase" in
    check)
      python3 -m opforge doctor
      /usr/bin/time -f "selftest wall %e s" python3 -m opforge selftest ;;
    bench)
      python3 -m opforge bench --refresh-ceilings --json "$OUT/h200-$stamp.json" \
        --plot "$OUT/h200-$stamp-roofline.png" --crossover-plot "$OUT/h200-$stamp-crossover.png" ;;
    tune)
      OPFORGE_AUTOTUNE=exhaustive python3 -m opforge tune --preset elementwise --export "$OUT/h200.jsonl" ;;
    sanitize)
      python3 -m opforge selftest --sanitize ;;
  esac
done 2>&1 | tee -a "$OUT/log-$stamp.txt"
