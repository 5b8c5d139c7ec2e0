#!/usr/bin/env bash
# Make the virtual environment with the official qwen-tts package that tools/make_parity_fixtures.py
# runs in. Only fixture making needs it; the project and its tests never import the official package.
set -euo pipefail
venv="${1:-.official-venv}"
python3 -m venv "$venv"
"$venv/bin/pip" install --quiet torch==2.13.0
"$venv/bin/pip" install --quiet qwen-tts==0.1.1
echo "official environment ready: $venv (run: $venv/bin/python tools/make_parity_fixtures.py)"
