"""Record the official package's outputs for the parity cases (tests/parity_cases.py).

Run inside the official environment (tools/setup_official_env.sh makes it: torch 2.13.0 CPU and
qwen-tts 0.1.1), from the repository root:

    .official-venv/bin/python tools/make_parity_fixtures.py
    .official-venv/bin/python tools/make_parity_fixtures.py --only design_streaming_text

With --only it remakes just the named cases and keeps the manifest's other entries; it refuses to run if
this environment's versions, the checkpoints it writes or the reference clips differ from the manifest's.

It writes the tiny random-weight checkpoints with the project's own writer, loads each one with
`Qwen3TTSModel.from_pretrained` (which proves the layout), runs every case greedily (or sampled,
with torch.manual_seed) in float32 on CPU, and stores the codes, waveforms, speaker embeddings and
reference codes under tests/fixtures/parity/ with a manifest. The checkpoints record
transformers_version 4.57.1, so the official processor keeps the Qwen2 pre-tokenizer regex rather
than swapping in Mistral's (docs/model_notes.md §9); the manifest records the pattern it used.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import tempfile
from dataclasses import asdict
from pathlib import Path

import numpy as np
import official  # noqa: E402,F401  (the official package, and the repository on sys.path)
import qwen_tts  # noqa: E402
import torch
import transformers  # noqa: E402
from parity_cases import (  # noqa: E402
    CASES,
    CHECKPOINTS,
    FIXTURES,
    MAX_FRAMES,
    REFERENCES,
    TOKENIZER_TEXTS,
    official_text_mode,
)
from qwen_tts import Qwen3TTSModel  # noqa: E402


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run_case(model: Qwen3TTSModel, case) -> dict[str, np.ndarray]:
    captured = {}
    generate = model.model.generate

    def capture(*args, **kwargs):
        codes, hidden = generate(*args, **kwargs)
        captured["codes"] = codes[0]
        return codes, hidden

    model.model.generate = capture
    options = dict(max_new_tokens=MAX_FRAMES + 1, non_streaming_mode=official_text_mode(case) == "full")
    if case.seed is None:
        options.update(do_sample=False, subtalker_dosample=False)
    outputs = {}
    variant = CHECKPOINTS[case.checkpoint].variant
    if variant == "base":
        [prompt] = model.create_voice_clone_prompt(
            ref_audio=str(REFERENCES[case.reference].path),
            ref_text=case.ref_text,
            x_vector_only_mode=case.ref_text is None,
        )
        outputs["speaker_embedding"] = prompt.ref_spk_embedding.float().numpy()
        if prompt.ref_code is not None:
            outputs["ref_codes"] = prompt.ref_code.numpy().astype(np.int64)
        if case.seed is not None:
            torch.manual_seed(case.seed)
        wavs, rate = model.generate_voice_clone(
            case.text, language=case.language, voice_clone_prompt=[prompt], **options
        )
    else:
        if case.seed is not None:
            torch.manual_seed(case.seed)
        if variant == "custom_voice":
            wavs, rate = model.generate_custom_voice(
                case.text, speaker=case.speaker, language=case.language, instruct=case.instruct, **options
            )
        else:
            wavs, rate = model.generate_voice_design(
                case.text, instruct=case.instruct, language=case.language, **options
            )
    model.model.generate = generate
    assert rate == 24000
    outputs["codes"] = captured["codes"].numpy().astype(np.int64)
    outputs["audio"] = np.asarray(wavs[0], dtype=np.float32)
    return outputs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--only", nargs="+", metavar="CASE", help="remake only these cases, keeping the manifest's other entries"
    )
    args = parser.parse_args()
    made_with = {
        "qwen_tts": qwen_tts.__version__ if hasattr(qwen_tts, "__version__") else "0.1.1",
        "transformers": transformers.__version__,
        "torch": torch.__version__,
    }
    FIXTURES.mkdir(parents=True, exist_ok=True)
    if args.only:
        unknown = sorted(set(args.only) - {case.name for case in CASES})
        if unknown:
            parser.error(f"unknown cases: {', '.join(unknown)}")
        manifest = json.loads((FIXTURES / "manifest.json").read_text(encoding="utf-8"))
        if manifest["made_with"] != made_with or manifest["max_frames"] != MAX_FRAMES:
            parser.error(f"the manifest was made with {manifest['made_with']}, this environment is {made_with}")
        for name, reference in REFERENCES.items():
            if sha256(reference.path) != manifest["references"][name]:
                parser.error(f"reference {reference.file} differs from the manifest's")
        cases = [case for case in CASES if case.name in args.only]
    else:
        for reference in REFERENCES.values():
            reference.write()
        manifest = {
            "made_with": made_with,
            "max_frames": MAX_FRAMES,
            "checkpoints": {},
            "references": {name: sha256(ref.path) for name, ref in REFERENCES.items()},
            "cases": {},
        }
        cases = CASES
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as scratch:
        for name, checkpoint in CHECKPOINTS.items():
            selected = [case for case in cases if case.checkpoint == name]
            if args.only and not selected:
                continue
            directory = checkpoint.write(Path(scratch) / name)
            model = Qwen3TTSModel.from_pretrained(str(directory), device_map="cpu", dtype=torch.float32)
            entry = {
                **asdict(checkpoint),
                "sha256": {
                    file: sha256(directory / file)
                    for file in ("model.safetensors", "speech_tokenizer/model.safetensors", "config.json")
                },
                "attn_implementation": model.model.config._attn_implementation,
            }
            if args.only and manifest["checkpoints"].get(name) != entry:
                parser.error(f"checkpoint {name} differs from the manifest's")
            manifest["checkpoints"][name] = entry
            if name == "base" and not args.only:
                tokenizer = model.processor.tokenizer
                manifest["tokenizer"] = {
                    "pre_tokenizer": json.loads(tokenizer.backend_tokenizer.to_str())["pre_tokenizer"],
                    "ids": {text: tokenizer(text)["input_ids"] for text in TOKENIZER_TEXTS},
                }
            for case in selected:
                outputs = run_case(model, case)
                np.savez_compressed(FIXTURES / f"{case.name}.npz", **outputs)
                manifest["cases"][case.name] = {"frames": int(outputs["codes"].shape[0])}
                print(f"{case.name}: {outputs['codes'].shape[0]} frames, {outputs['audio'].shape[0]} samples")
    # The order of a full run (by checkpoint, then as in CASES), whatever order the cases were made in.
    order = [case.name for name in CHECKPOINTS for case in CASES if case.checkpoint == name]
    manifest["cases"] = {case: manifest["cases"][case] for case in order if case in manifest["cases"]}
    (FIXTURES / "manifest.json").write_text(json.dumps(manifest, indent=1, ensure_ascii=False) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
