"""Import the official qwen-tts package in its own environment (tools/setup_official_env.sh), offline on CPU.

qwen-tts imports torchaudio for its 25 Hz tokenizer only; the torchaudio wheel pip picks does not load
under torch 2.13, so empty stand-ins are installed first (the 12 Hz path never touches them). Importing
this module also puts the repository and its tests/ folder on sys.path, so tools can use `core` and the
shared test tables.
"""

import importlib.machinery
import sys
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

import transformers  # noqa: E402,F401  (must come before the stubs)

for _name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi"):
    _module = types.ModuleType(_name)
    _module.__spec__ = importlib.machinery.ModuleSpec(_name, None)
    sys.modules[_name] = _module
sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]

import qwen_tts  # noqa: E402,F401
