#!/usr/bin/env bash
# One device session on the lent H200: doctor, selftest, bench, (tune).
# Usage (device tool): bash benchmarks/run_h200.sh PHASE...
#   phases: check gpu-tests bench bench-families bench-each tune tune-bench sanitize sass extras profile
#           profile-cases tpch dist stream tune-engines
#   (bench-families: the families in $BENCH_FAMILIES in one run, compiled first in $PREWARM processes;
#    sass: wgmma/TMA instructions of the kernels in Triton's cache; extras: attention peak memory and
#    accuracy tables, hash-join and Zipf skew-join benches; profile: `opforge profile` over every op, ncu on one op, the
#    example ladders under ncu; profile-cases: ncu on the bench cases in $PROFILE_CASES; dist: on nvidia-h200-x2, opforge.distributed's tests over NCCL and the
#    overlapped tensor-parallel GEMM bench, and the distributed join bench: broadcast vs partitioned)
#   (tune-bench tunes every bench shape of the families in $TUNE_FAMILIES within $TUNE_BUDGET seconds;
#    tune-engines tunes what TPC-H at $TPCH_SF and Nexmark launch: nothing tunes inside a query by default)
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
    gpu-tests)
      OPFORGE_INTERPRET=0 python3 -m pytest ${GPU_TESTS:-tests/gpu} -v --durations=15 -p no:cacheprovider ;;
    bench-families)
      fams=(); for f in ${BENCH_FAMILIES:-softmax norm reduce scan cross_entropy transpose fusion quant}; do fams+=(--family "$f"); done
      timeout "${BENCH_LIMIT:-540}" python3 -m opforge bench "${fams[@]}" --no-crossover --no-host --prewarm "${PREWARM:-12}" \
        --json "$OUT/h200-$stamp-${BENCH_NAME:-families}.json" --plot "$OUT/h200-$stamp-${BENCH_NAME:-families}-roofline.png" \
        || echo "bench-families: exit $?" ;;
    bench-each)
      # one JSON per family, each under its own time limit, so one slow family cannot starve the rest
      for f in ${BENCH_FAMILIES:-softmax norm reduce scan cross_entropy transpose fusion quant gemm}; do
        timeout "${FAMILY_LIMIT:-90}" python3 -m opforge bench --family "$f" --no-crossover --no-host --prewarm "${PREWARM:-12}" \
          --json "$OUT/h200-$stamp-$f.json" || echo "bench $f: exit $?"
      done ;;
    tune)
      OPFORGE_AUTOTUNE=exhaustive python3 -m opforge tune --preset elementwise --export "$OUT/h200.jsonl" ;;
    tune-bench)
      fams=(); for f in ${TUNE_FAMILIES:-softmax norm}; do fams+=(--family "$f"); done
      OPFORGE_AUTOTUNE=exhaustive python3 -m opforge tune --preset bench "${fams[@]}" \
        --budget "${TUNE_BUDGET:-300}" --export "$OUT/h200-bench.jsonl" ;;
    sanitize)
      python3 -m opforge selftest --sanitize ;;
    dist)
      export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1 OPFORGE_AUTOTUNE=off
      OPFORGE_INTERPRET=0 OPFORGE_DIST_TEST_BACKEND=nccl timeout 110 python3 -m pytest tests/distributed -q -p no:cacheprovider
      timeout 170 python3 -m torch.distributed.run --nproc-per-node "$(python3 -c 'import torch; print(torch.cuda.device_count())')" \
        benchmarks/dist_overlap.py --json "$OUT/dist-overlap-$stamp.json"
      timeout 150 python3 -m torch.distributed.run --nproc-per-node "$(python3 -c 'import torch; print(torch.cuda.device_count())')" \
        benchmarks/dist_join.py --json "$OUT/dist-join-$stamp.json" ;;
    profile)
      # issue 6 on the GPU: every op through `opforge profile`'s API, one op and one user kernel under ncu,
      # and the two example ladders with their reports
      timeout "${PROFILE_ALL_LIMIT:-200}" python3 benchmarks/profile_all.py --json "$OUT/profile-all-$stamp.json"
      [ "${PROFILE_NCU_OP:-1}" = 1 ] && timeout 80 python3 -m opforge profile softmax --shape 8192x8192 --dtype bf16 --arg -1 --max-configs 4 --ncu \
        --out "$OUT/profile-softmax"
      for ex in ${LADDERS:-transpose_ladder reduction_ladder gemm_ladder}; do
        timeout 60 python3 examples/$ex.py --ncu --out "$OUT/$ex" || echo "$ex: exit $?"
      done ;;
    tpch)
      # issue 8: TPC-H against DuckDB on the same host at each scale factor in $TPCH_SF
      for sf in ${TPCH_SF:-1 10}; do
        timeout "${TPCH_LIMIT:-400}" python3 benchmarks/tpch.py --sf "$sf" --device cuda --repeats "${TPCH_REPEATS:-3}" \
          --out "$OUT/tpch-cuda-sf$sf-$stamp.json" || echo "tpch sf$sf: exit $?"
      done
      # the cache's entries for the queries' shapes (group_by, hash_join, ...; tuned by tune-engines, as
      # nothing tunes inside a query by default): the entries to ship
      python3 -m opforge tune --export "$OUT/h200-$stamp-tpch-tuned.jsonl" ;;
    tune-engines)
      # issue 23: run the engines' workloads in mode on, so the buckets they launch are tuned offline
      for sf in ${TPCH_SF:-1 10}; do
        timeout "${TUNE_LIMIT:-500}" python3 -m opforge tune --preset sql --sf "$sf" || echo "tune sql sf$sf: exit $?"
      done
      timeout "${TUNE_LIMIT:-500}" python3 -m opforge tune --preset stream --events "${STREAM_EVENTS:-16777216}" \
        --batch-size "${STREAM_BATCH:-2097152}" || echo "tune stream: exit $?"
      python3 -m opforge tune --export "$OUT/h200-$stamp-engines-tuned.jsonl" ;;
    profile-cases)
      # the slow bench cases of issue 3 under ncu: `opforge profile --case` takes a case's own inputs
      IFS=';' read -ra cases <<< "${PROFILE_CASES:-cross_entropy_fused 8192x32000 fwd+bwd bfloat16;amax 8x64x131072;compact 268435456;softmax 2048x65536 bfloat16;sum 32768x8192 dim=0 bfloat16;cumsum 1073741824 float32}"
      for c in "${cases[@]}"; do
        slug=$(echo "$c" | tr -c 'A-Za-z0-9\n' '_' | cut -c1-60)
        timeout 120 python3 -m opforge profile --case "$c" --max-configs 4 --ncu --out "$OUT/case-$slug" || echo "case $c: exit $?"
      done ;;
    sass)
      python3 benchmarks/sass_check.py --json "$OUT/sass-$stamp.json" ;;
    stream)
      # issue 10: Nexmark with events generated in device memory, in micro-batches large enough that the
      # per-batch host cost (~2.5 ms, third session) stops dominating, 32 of them (with 8, one slow batch
      # in the timed run halved q5's figure); then host-fed and the Bytewax peer
      timeout "${STREAM_LIMIT:-300}" python3 benchmarks/stream_nexmark.py --device cuda --events "${STREAM_EVENTS:-268435456}" \
        --batch-size "${STREAM_BATCH:-8388608}" --queries "${STREAM_QUERIES:-q0,q1,q2,q5,q7,tumble_count}" --feeds device \
        --peers bytewax,cpu --peer-events 2000000 \
        --json "$OUT/stream-nexmark-large-$stamp.json" || echo "stream large: exit $?"
      # latency at half the measured throughput
      timeout "${STREAM_LIMIT:-300}" python3 benchmarks/stream_nexmark.py --device cuda --events 16777216 \
        --batch-size 2097152 --queries q1,q5,q7 --feeds device --paced 0.5 \
        --json "$OUT/stream-nexmark-latency-$stamp.json" || echo "stream latency: exit $?"
      # latency to the exactly-once sink's commits: checkpoints every 50 ms, so that a run at full speed
      # spans many of them (Parquet part files; q1, whose output is most of its input, also into Arrow IPC)
      timeout "${STREAM_LIMIT:-300}" python3 benchmarks/stream_nexmark.py --device cuda --events 67108864 \
        --batch-size 2097152 --queries q1,q5,q7 --feeds device --exactly-once-ms 50 \
        --json "$OUT/stream-nexmark-exactly-once-$stamp.json" || echo "stream exactly-once: exit $?"
      timeout "${STREAM_LIMIT:-300}" python3 benchmarks/stream_nexmark.py --device cuda --events 67108864 \
        --batch-size 2097152 --queries q1 --feeds device --exactly-once-ms 50 --sink-format arrow \
        --json "$OUT/stream-nexmark-exactly-once-arrow-$stamp.json" || echo "stream exactly-once arrow: exit $?"
      timeout "${STREAM_LIMIT:-300}" python3 benchmarks/stream_nexmark.py --device cuda --events 4000000 \
        --batch-size 1048576 --json "$OUT/stream-nexmark-$stamp.json" || echo "stream: exit $?" ;;
    extras)
      timeout 240 python3 -c "import json, torch; from opforge.bench import attention as A; d = torch.device('cuda'); \
json.dump({'peak_memory': A.peak_memory_table(d), 'accuracy': A.accuracy_table(d)}, open('$OUT/attention-tables-$stamp.json', 'w'), indent=1, default=str)"
      timeout 240 python3 benchmarks/hash_join.py --out "$OUT/hash-join-$stamp.json"
      timeout 120 python3 benchmarks/join_skew.py --device cuda --probe 50000000 --build 1000000 \
        --json "$OUT/join-skew-$stamp.json" ;;
  esac
done 2>&1 | tee -a "$OUT/log-$stamp.txt"
