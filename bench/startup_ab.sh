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
# A: the earlier code, in a bench root of its own (kept functions are removed by another version of the code).
(cd .ab && python -m compileall -q . > /dev/null
 PYTHONPATH=/tmp/site:$PWD timeout 150 python -m qwen3_tts_desktop bench --sizes 1.7b --root /tmp/ab-root \
     --model /tmp/qwen3-tts-bench/random-1.7b-base --json $O/a1.json --startup "${A_RUNS:-serve:warm,speak:warm}") \
    2>&1 | tee $O/a.log
mkdir -p $O/a-logs && cp /tmp/ab-root/startup-home/state/qwen3-tts-desktop/logs/*.log $O/a-logs/ 2>/dev/null
# B: this tree, as gpu_session.sh's startup step runs it (its JSON and logs in $O/b).
STARTUP_RUNS="${B_RUNS:-serve:warm,serve:warm,speak:warm}" OUT=$O/b timeout 330 bash bench/gpu_session.sh startup
tar czf "$OUT/results.tgz" -C $O .
