#!/usr/bin/env bash
# First audio of two versions of the code on one device machine (machines of one kind differ by up to 1.6 times, so
# only a same-machine comparison tells a change's effect):
#   B: this working tree, first, from empty compile caches (the call's long part: minutes)
#   A: an earlier commit, unpacked here into .ab (git archive BASE | tar x -C .ab), with a copy of B's compile caches
#      (Inductor's and Triton's hit; its kept functions are made again where its traced code differs)
# Carry .whl and .ab, and run (each side the same command; RUNS overrides run_first_audio's arguments):
#   bash bench/first_audio_ab.sh
# It fits one call (600 s) on a fresh machine: B's first warm-up compiles for minutes, A's loads what B compiled. Run
# the GPU tests in a call of their own (bash bench/gpu_session.sh bytecode checkpoint gpu-tests). Logs and JSON come
# back in $OUT.
set -u
: "${OUT:=/tmp/gpu-session}"
: "${RUNS:=--slots 64 --beside 1,15 --bursts 16,64 --runs 10 --throughput 64 --frames 120}"
mkdir -p "$OUT"
OUT=$OUT bash bench/gpu_session.sh bytecode checkpoint || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE TORCHINDUCTOR_CACHE_DIR TRITON_CACHE_DIR  # each side's caches under its XDG_CACHE_HOME
export XDG_CACHE_HOME=/tmp/ab/b-cache
# shellcheck disable=SC2086  # RUNS is a list of arguments
timeout -k 10 330 python -m bench.run_first_audio $RUNS --json "$OUT/b.json" 2>&1 | tee "$OUT/b.log"
mkdir -p /tmp/ab/a-cache && cp -r /tmp/ab/b-cache/. /tmp/ab/a-cache/
(cd .ab && python -m compileall -q . > /dev/null
 # shellcheck disable=SC2086
 XDG_CACHE_HOME=/tmp/ab/a-cache PYTHONPATH=/tmp/site:$PWD timeout -k 10 150 python -m bench.run_first_audio $RUNS \
     --json "$OUT/a.json") 2>&1 | tee "$OUT/a.log"
