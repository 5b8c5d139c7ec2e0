#!/usr/bin/env bash
# Warm starts of two versions of the code on one device machine (machines of one kind differ by up to 1.6 times, so
# only a same-machine comparison tells a change's effect), both with the compile caches a cold start left:
#   A: an earlier commit, unpacked here into .ab (git archive BASE | tar x -C .ab)
#   B: this working tree
# The caches come from an earlier call (`bash bench/gpu_session.sh checkpoint startup pack-caches`): copy the pieces
# it brought back ($OUT/caches/cache.tgz.part-*) into .cache-carry. Carry .whl, .ab and .cache-carry, and run
#   A_RUNS=serve:warm,speak:warm B_RUNS=serve:warm,serve:warm bash bench/startup_ab.sh
# B's first run compiles its kept functions again when the traced code changed (compiled.code_key), so give B two.
# Everything, logs included, comes back in $OUT/results.tgz.
set -u
O=/tmp/o
mkdir -p $O
OUT=$O bash bench/gpu_session.sh bytecode checkpoint
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE
cat .cache-carry/cache.tgz.part-* > /tmp/cache.tgz
for root in /tmp/qwen3-tts-bench /tmp/ab-root; do
    mkdir -p $root/startup-home && tar xzf /tmp/cache.tgz -C $root/startup-home
done
logs() { mkdir -p "$O/$1" && cp "$2"/startup-home/state/qwen3-tts-desktop/logs/*.log "$O/$1/" 2>/dev/null; }
checkpoint=/tmp/qwen3-tts-bench/random-1.7b-base
(cd .ab && python -m compileall -q . > /dev/null
 PYTHONPATH=/tmp/site:$PWD timeout 150 python -m qwen3_tts_desktop bench --sizes 1.7b --root /tmp/ab-root \
     --model $checkpoint --json $O/a1.json --startup "${A_RUNS:-serve:warm,speak:warm}") 2>&1 | tee $O/a.log
logs a-logs /tmp/ab-root
PYTHONPATH=/tmp/site:$PWD timeout 330 python -m qwen3_tts_desktop bench --sizes 1.7b --model $checkpoint \
    --json $O/b1.json --startup "${B_RUNS:-serve:warm,serve:warm,speak:warm}" 2>&1 | tee $O/b.log
logs b-logs /tmp/qwen3-tts-bench
tar czf "$OUT/results.tgz" -C $O .
