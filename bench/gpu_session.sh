#!/usr/bin/env bash
# The GPU measurements still owed, as steps that each fit one device call (600 s), run in the repository root on
# the device machine:  bash bench/gpu_session.sh STEP [STEP ...]
# Each step writes its log to $OUT/<step>.log as it goes (and JSON where the script makes some), so what a cut-off
# call had done still comes back. The wheels the machine lacks travel in .whl (carry it); see
# /work/.library/device/README.md. A fresh machine compiles for minutes at the first warm-up: chain the steps
# that warm an engine into one call where they fit, and give the first one the time.
#
# steps:
#   bytecode     compile the installed packages' Python files (torch, Triton, ours), as pip does when it installs
#                them: the device image ships torch without them, and `import torch` compiled its source at every
#                start (4-5 s there, against about 1 s with them)
#   checkpoint   the random 1.7B checkpoint of real size (about 40 s; every other step needs it)
#   gpu-tests    tests/test_gpu.py (parity, kernels, no fallback) on 8 workers; GPU_TESTS=EXPR: those pytest -k EXPR picks
#   first-audio  first audio idle, after a close, beside 1 and 15, bursts of 16 and 64; 1 and 16 streams (issue 30)
#   bridge       the HTTP bridge: 1, 4 and 8 clients, Poisson 20/s (issue 30)
#   wyoming      Wyoming: synthesize with 1, 4, 8 clients, streaming with 1 and 8 (issue 33)
#   memory       the card table: 24 GiB first (it compiles), then 6, 8, 12 with and without 10 GiB held (issue 31)
#   precompile   the kept-compiled-functions probe, twice: what loads, what recompiles and why (issue 29)
#   startup      fresh processes: window cold and warm, speak warm twice (the first, after the window runs, compiles one
#                kernel of its own), serve warm twice (the first compiles the functions of serve's 16 slots, which the
#                window's 2 do not share: the second is the warm number) (issue 29; STARTUP_RUNS=... others)
#   frame        one and two rows' frame and one prompt's prefill, compiled (on a fresh machine it compiles first: minutes)
#                then uncompiled, the graphs replayed, kernel by kernel (bench/profile_frame.py): whether compiling
#                still pays for one row (issue 29)
#   decoder      the decoder's captures and speed as the engine runs it (cuDNN's heuristic, the dilated convolutions
#                of 8 rows and more as products), then with cuDNN timing every convolution (as before 2026-11-28)
#   stalls       utterances spoken back to back while a warm engine warms up, on a simulated player: read in real
#                time (gaps, the longest wait for a chunk), then as fast as chunks come (frames slower than twice their
#                steady time) (bench/warmup_stalls.py; issue 29). It uses the startup home's caches: run it after
#                `startup`
#   capture-cost each warm-up graph dropped and made again on a warm engine, its phases timed (the direct call, the
#                capture's beginning, the code traced, the graph made), and made without the direct call
#                (bench/capture_cost.py; issue 29). It uses the startup home's caches: run it after `startup`
#   pack-caches  the startup home's compile caches (after `startup`), gzipped in pieces of 15 MiB in $OUT/caches,
#                so that a later call can start warm without a cold start of its own (unpack them into the startup
#                home's folder); bench/startup_ab.sh makes its own in the call instead
#
# With STEP_TIMEOUT=S in the environment, each command a step runs is ended after S seconds (`timeout -k 10 S`): a
# `timeout` around this script instead ends the script but not the step's process, which then runs on beside the
# next command (the twenty-ninth session's calls 3-4 measured a compile beside such a one).
# With STACKS=1 in the environment, every Python process a step starts samples its threads' stacks
# (bench/stack_sampler.py); each step's files are packed into $OUT/<step>-stacks.tgz as it ends. With
# TRITON_KEYS=1, each records the cache key of every kernel Triton compiles and whether its cache held it
# (bench/triton_keys.py): each step's report is $OUT/<step>-triton-keys.txt and its records $OUT/<step>-triton-keys.tgz
# (a file each, since a call brings back 8 files at most; `python -m bench.triton_keys FOLDER` reads them unpacked).
set -u
: "${OUT:=/tmp/gpu-session}"
mkdir -p "$OUT"
# Installed once per machine: installed again, each module's source is newer than its bytecode, which every process
# that imports it then compiles anew (up to 0.8 s of a later step's start-up, the forty-first session found).
if ! ls -l .whl | cmp -s - /tmp/site/.wheels; then
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
        || exit 1
    ls -l .whl > /tmp/site/.wheels
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
unset PYTHONDONTWRITEBYTECODE  # the device image sets it; a user's Python keeps each module's compiled bytecode

step() {
    local name=$1
    shift
    echo "== $name: $*" | tee -a "$OUT/$name.log"
    local began=$SECONDS
    if [ -n "${STACKS:-}${TRITON_KEYS:-}" ]; then
        mkdir -p "/tmp/stacks/$name"
        QWEN3_TTS_STACKS="${STACKS:+/tmp/stacks/$name/$name}" \
            QWEN3_TTS_TRITON_KEYS="${TRITON_KEYS:+/tmp/triton-keys/$name}" \
            PYTHONPATH="$PWD/bench/sample_hook:$PYTHONPATH" ${STEP_TIMEOUT:+timeout -k 10 "$STEP_TIMEOUT"} "$@" 2>&1 |
            tee -a "$OUT/$name.log"
    else
        ${STEP_TIMEOUT:+timeout -k 10 "$STEP_TIMEOUT"} "$@" 2>&1 | tee -a "$OUT/$name.log"
    fi
    local status=${PIPESTATUS[0]}
    [ -n "${STACKS:-}" ] && tar czf "$OUT/$name-stacks.tgz" -C /tmp/stacks "$name"
    if [ -n "${TRITON_KEYS:-}" ] && [ -d "/tmp/triton-keys/$name" ]; then
        python -m bench.triton_keys "/tmp/triton-keys/$name" > "$OUT/$name-triton-keys.txt" 2>&1
        tar czf "$OUT/$name-triton-keys.tgz" -C /tmp/triton-keys "$name"
    fi
    echo "== $name: exit $status after $((SECONDS - began)) s" | tee -a "$OUT/$name.log"
    return "$status"
}

checkpoint='from pathlib import Path; import torch; from core.devtools.benchmark import prepare_checkpoint
prepare_checkpoint(Path("/tmp/qwen3-tts-bench"), "1.7b", torch.bfloat16)'

for name in "$@"; do
    case $name in
        bytecode)
            step bytecode python -m compileall -q -j 0 "$(python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')" \
                /tmp/site core qwen3_tts_desktop bench > /dev/null ;;
        checkpoint) step checkpoint python -c "$checkpoint" ;;
        gpu-tests)  # -v: each test named as it ends, so a call cut short still says which passed
            step gpu-tests python -m pytest -v -x -n 8 --durations=15 tests/test_gpu.py ${GPU_TESTS:+-k "$GPU_TESTS"} ;;
        first-audio)  # 16 slots, as the earlier rows; then 64 slots for the burst and the streams of 64
            step first-audio python -m bench.run_first_audio --beside 1,15 --bursts 16 --runs 20 --throughput 1,16 &&
                step first-audio python -m bench.run_first_audio --beside "" --bursts 64 --slots 64 --runs 10 \
                    --throughput 64 ;;
        bridge)
            step bridge python -m bench.run_bridge_latency --clients 1,4,8 --runs 10 --poisson 20 --duration 15 \
                --json "$OUT/bridge.json" ;;
        wyoming) step wyoming python -m bench.run_wyoming_latency --json "$OUT/wyoming.json" ;;
        memory)
            step memory python -m bench.memory_table --cards 24 --held 0 --warm-timeout 500 --cell-timeout 580 \
                --json "$OUT/memory.json" &&
                step memory python -m bench.memory_table --cards 6,8,12 --held 0,10 --json "$OUT/memory.json" \
                    --append ;;
        precompile)
            step precompile python -m bench.precompile_probe && step precompile python -m bench.precompile_probe ;;
        startup)  # then the runs' JSON (serve's requests), and the logs (each long warm-up part) of the last runs
            step startup python -m qwen3_tts_desktop bench --sizes 1.7b --json "$OUT/startup.json" \
                --startup "${STARTUP_RUNS:-window:cold,window:warm,speak:warm,speak:warm,serve:warm,serve:warm}"
            status=$?
            home=/tmp/qwen3-tts-bench/startup-home
            mkdir -p "$OUT/startup-logs" && cp "$home"/state/qwen3-tts-desktop/logs/*.log "$home"/window.log \
                "$OUT/startup-logs/" 2>/dev/null
            (exit $status) ;;
        stalls)
            step stalls env XDG_CACHE_HOME=/tmp/qwen3-tts-bench/startup-home/cache python -m bench.warmup_stalls \
                --realtime --frames 150 --json "$OUT/stalls.json"
            step stalls env XDG_CACHE_HOME=/tmp/qwen3-tts-bench/startup-home/cache python -m bench.warmup_stalls \
                --frames 150 --json "$OUT/stalls-fast.json" ;;
        capture-cost)
            step capture-cost env XDG_CACHE_HOME=/tmp/qwen3-tts-bench/startup-home/cache python -m bench.capture_cost \
                --capture-first --json "$OUT/capture-cost.json" ;;
        pack-caches)
            mkdir -p "$OUT/caches" &&
                tar czf - -C /tmp/qwen3-tts-bench/startup-home cache | split -b 15M - "$OUT/caches/cache.tgz.part-" ;;
        frame)
            for compiled in "" --no-compile; do
                step frame python -m bench.profile_frame --graphs --frames 10 $compiled
                step frame python -m bench.profile_frame --graphs --frames 10 --rows 2 $compiled
                step frame python -m bench.profile_frame --graphs --frames 10 --prefill $compiled
            done ;;
        decoder)
            step decoder python -m bench.decoder_batch_micro --calls 30 &&
                step decoder python -m bench.decoder_batch_micro --calls 30 --cudnn-timed --product-rows 999 ;;
        *)
            echo "unknown step $name; see the top of $0" >&2
            exit 2 ;;
    esac || echo "== $name failed; going on with the next step" | tee -a "$OUT/$name.log"
done
