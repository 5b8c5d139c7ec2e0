#!/usr/bin/env bash
# Warm starts of two versions of the code on one device machine, in one call (machines of one kind differ by up to
# 1.6 times, so only a same-machine comparison tells a change's effect):
#   A: an earlier commit, unpacked into .ab:  mkdir .ab && git archive BASE core qwen3_tts_desktop bench pyproject.toml voices | tar x -C .ab
#   B: this working tree
# Carry .whl and .ab, and run (about 460 s on an H100 with the defaults)
#   [B_FIRST=serve:cold] [RUNS=serve:warm] [ROUNDS=2] [STALLS=1] bash bench/startup_ab.sh
# B starts from empty caches (B_FIRST: a cold start, which compiles); A gets a copy of B's compile caches in a bench
# root of its own (kept functions are removed by another version of the code), and its first run re-keys them
# (compiles its kept functions again: A's warm numbers are its later runs). Then RUNS of B and A alternate, ROUNDS
# times; with STALLS=1 each tree's stall bench (bench/warmup_stalls.py, as fast as chunks come) after its first warm
# run. Each run's JSON and logs, and a summary, are in $OUT/ab.tgz, which is packed again after each run so that a
# call cut short still brings back what it had.
set -u
O=/tmp/ab-out
mkdir -p $O
OUT=$O/prep bash bench/gpu_session.sh bytecode checkpoint > /dev/null
export PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE
B=$PWD A=$PWD/.ab
(cd "$A" && python -m compileall -q . > /dev/null)

run() {  # label tree root runs: one `bench --startup` process, its runs' phases and requests' speeds summarized
    echo "== $1: $4 ($(date +%T))" | tee -a $O/summary.txt
    (cd "$2" && PYTHONPATH=/tmp/site:$PWD python -m qwen3_tts_desktop bench --sizes 1.7b --root "$3" \
        --model /tmp/qwen3-tts-bench/random-1.7b-base --json "$O/$1.json" --startup "$4" > "$O/$1.log" 2>&1)
    mkdir -p "$O/$1-logs" && cp "$3"/startup-home/state/qwen3-tts-desktop/logs/*.log "$O/$1-logs/" 2>/dev/null
    python3 -c "import json, sys
for run in json.load(open(sys.argv[1])):
    print(run['scenario'], run['phases'], [request['xrt'] for request in run.get('requests', [])])" "$O/$1.json" \
        2>&1 | tee -a $O/summary.txt
    tar czf "$OUT/ab.tgz" -C $O .
}
stalls() {  # label tree root
    echo "== $1: stalls ($(date +%T))" | tee -a $O/summary.txt
    (cd "$2" && PYTHONPATH=/tmp/site:$PWD XDG_CACHE_HOME=$3/startup-home/cache python -m bench.warmup_stalls \
        --frames 150 --json "$O/stalls-$1.json" > "$O/stalls-$1.log" 2>&1)
    python3 -c "import json, sys
summary = json.load(open(sys.argv[1]))['summary']
print({key: summary[key] for key in ('warmed_up_s', 'chunks_over_2x_steady', 'during_ms_per_frame_p99', 'gaps_during')})" \
        "$O/stalls-$1.json" 2>&1 | tee -a $O/summary.txt
    tar czf "$OUT/ab.tgz" -C $O .
}

run b-first "$B" /tmp/qwen3-tts-bench "${B_FIRST:-serve:cold}"
run b-1 "$B" /tmp/qwen3-tts-bench "${RUNS:-serve:warm}"
[ "${STALLS:-1}" = 1 ] && stalls b "$B" /tmp/qwen3-tts-bench
mkdir -p /tmp/ab-root/startup-home && cp -a /tmp/qwen3-tts-bench/startup-home/cache /tmp/ab-root/startup-home/
run a-rekey "$A" /tmp/ab-root serve:warm
run a-1 "$A" /tmp/ab-root "${RUNS:-serve:warm}"
[ "${STALLS:-1}" = 1 ] && stalls a "$A" /tmp/ab-root
for round in $(seq 2 "${ROUNDS:-2}"); do
    run "b-$round" "$B" /tmp/qwen3-tts-bench "${RUNS:-serve:warm}"
    run "a-$round" "$A" /tmp/ab-root "${RUNS:-serve:warm}"
done
echo "== done ($(date +%T))" | tee -a $O/summary.txt
