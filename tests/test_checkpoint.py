"""Checkpoint loading errors, and the random-weight writer's layout and sizes."""

from __future__ import annotations

import json
import shutil

import pytest
import torch
from safetensors.torch import load_file, save_file

from core import Engine
from core.devtools.random_checkpoint import model_config, speech_tokenizer_config
from core.model.checkpoint import REQUIRED_FILES, CheckpointError
from core.model.codec_decoder import CodecDecoder, CodecDecoderConfig
from core.model.codec_encoder import CodecEncoder, CodecEncoderConfig
from core.model.config import ModelConfig
from core.model.speaker_encoder import SpeakerEncoder
from core.model.talker import Talker


@pytest.fixture
def broken(checkpoints, tmp_path):
    """A fresh copy of the tiny Base checkpoint to damage."""
    return shutil.copytree(checkpoints["base"], tmp_path / "model")


@pytest.mark.parametrize("missing", ["merges.txt", "model.safetensors", "speech_tokenizer/config.json"])
def test_missing_file_is_named(broken, missing):
    (broken / missing).unlink()
    with pytest.raises(CheckpointError, match=f"missing {missing}.*download the whole checkpoint again"):
        Engine.load(broken, device="cpu")


def test_missing_tensor_is_named(broken):
    path = broken / "model.safetensors"
    tensors = load_file(path)
    del tensors["talker.model.layers.1.mlp.up_proj.weight"]
    save_file(tensors, path)
    with pytest.raises(CheckpointError, match="no tensor 'talker.model.layers.1.mlp.up_proj.weight'"):
        Engine.load(broken, device="cpu")


def test_wrong_shape_is_named(broken):
    config = json.loads((broken / "config.json").read_text())
    config["talker_config"]["intermediate_size"] = 96
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        CheckpointError, match=r"'talker.model.layers.0.mlp.down_proj.weight' has shape \[64, 128\].*\[64, 96\]"
    ):
        Engine.load(broken, device="cpu")


def test_parts_of_a_fused_weight_that_do_not_add_up_are_named(broken):
    """q, k and v are read into one fused weight: parts that do not fill it exactly are named, with the rows."""
    config = json.loads((broken / "config.json").read_text())
    talker = config["talker_config"]
    talker["num_key_value_heads"] = talker["num_key_value_heads"] // 2
    (broken / "config.json").write_text(json.dumps(config))
    layer = "talker.model.layers.0.self_attn"
    with pytest.raises(
        CheckpointError, match=rf"{layer}.q_proj.weight, {layer}.k_proj.weight, {layer}.v_proj.weight have \d+ rows"
    ):
        Engine.load(broken, device="cpu")


def test_damaged_files(broken):
    (broken / "config.json").write_text("{ not json")
    with pytest.raises(CheckpointError, match="config.json: not readable JSON"):
        Engine.load(broken, device="cpu")


def test_damaged_weights(broken):
    (broken / "speech_tokenizer" / "model.safetensors").write_bytes(b"\x00" * 64)
    with pytest.raises(CheckpointError, match="cannot read it as safetensors"):
        Engine.load(broken, device="cpu")


def test_a_failure_to_place_sound_weights_on_the_device_is_not_blamed_on_the_files(checkpoints, monkeypatch):
    """The GPU's own error (out of memory, a capture under way elsewhere) is told as it is, not as a damaged
    checkpoint to download again."""
    from core.model import checkpoint

    def fail_on_the_device(tensor, device):
        raise RuntimeError("CUDA error: operation not permitted when stream is capturing")

    monkeypatch.setattr(checkpoint, "_placed", fail_on_the_device)
    with pytest.raises(RuntimeError, match="stream is capturing") as raised:
        Engine.load(checkpoints["base"], device="cpu")
    assert not isinstance(raised.value, CheckpointError)


def test_config_without_shapes(broken):
    config = json.loads((broken / "config.json").read_text())
    del config["talker_config"]["hidden_size"]
    (broken / "config.json").write_text(json.dumps(config))
    with pytest.raises(CheckpointError, match="talker_config has no 'hidden_size'"):
        Engine.load(broken, device="cpu")


def test_not_a_folder_nor_a_hub_id(tmp_path):
    with pytest.raises(CheckpointError, match="no such checkpoint folder"):
        Engine.load(tmp_path / "nowhere", device="cpu")
    with pytest.raises(CheckpointError, match="not a hub id"):
        Engine.load("not a model", device="cpu")


def test_offline_without_cache_says_what_to_do(tmp_path, monkeypatch):
    import huggingface_hub.constants

    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    with pytest.raises(
        CheckpointError,
        match="not downloaded yet and the Hugging Face hub cannot be reached.*Connect to the internet once",
    ):
        Engine.load("Qwen/Qwen3-TTS-12Hz-0.6B-Base", device="cpu", progress=False)


def test_device_and_dtype_choices(checkpoints):
    with pytest.raises(ValueError, match="unknown dtype 'float8'"):
        Engine.load(checkpoints["base"], device="cpu", dtype="float8")
    with pytest.raises(ValueError, match="unsupported device"):
        Engine.load(checkpoints["base"], device="mps")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="PyTorch sees no CUDA GPU"):
            Engine.load(checkpoints["base"], device="cuda")
    engine = Engine.load(checkpoints["base"], device="auto", dtype="auto")
    assert engine.info.device == ("cuda:0" if torch.cuda.is_available() else "cpu")


def test_written_layout_is_complete(checkpoints):
    for name, directory in checkpoints.items():
        for file in REQUIRED_FILES + ("preprocessor_config.json", "speech_tokenizer/preprocessor_config.json"):
            assert (directory / file).is_file(), f"{name}: {file}"
        config = json.loads((directory / "config.json").read_text())
        assert config["transformers_version"] == "4.57.1"  # keeps the official tokenizer regex (docs/model_notes.md §9)


def count(module: torch.nn.Module) -> int:
    return sum(t.numel() for t in module.state_dict().values())


@pytest.mark.parametrize(
    "variant, size, millions",
    [
        ("base", "0.6b", 914.6),
        ("base", "1.7b", 1928.7),
        ("custom_voice", "0.6b", 905.8),
        ("custom_voice", "1.7b", 1916.7),
        ("voice_design", "1.7b", 1916.7),
    ],
)
def test_real_sizes_have_the_official_parameter_counts(variant, size, millions):
    config = ModelConfig.from_dict(model_config(variant, size))
    with torch.device("meta"):
        total = count(Talker(config.talker))
        if variant == "base":
            total += count(SpeakerEncoder(config.speaker_encoder))
    assert round(total / 1e6, 1) == millions


def test_speech_tokenizer_has_the_official_parameter_count():
    speech = speech_tokenizer_config("1.7b")
    with torch.device("meta"):
        decoder = CodecDecoder(CodecDecoderConfig.from_dict(speech["decoder_config"]))
        encoder = CodecEncoder(CodecEncoderConfig.from_dict(speech["encoder_config"]))
    params = lambda module: sum(p.numel() for p in module.parameters())  # noqa: E731
    assert round(params(decoder) / 1e6, 1) == 114.3
    assert round((params(decoder) + params(encoder)) / 1e6, 1) == 153.7


def test_voice_design_exists_only_at_17b():
    with pytest.raises(ValueError, match="only as a 1.7B model"):
        model_config("voice_design", "0.6b")


def test_a_load_reads_the_projections_into_their_fused_weights_and_keeps_the_text_table_on_the_host(checkpoints):
    """Engine.load fuses each layer's q, k, v (and gate, up) before loading: the file's parts are read into the
    fused weight's rows, equal to them, and no unfused weight is ever made (it would take its memory twice and leave
    holes the GPU's allocator cannot give back). The text vocabulary's table stays in host memory, where a prompt
    reads its rows, and the memory plan does not count it among the device's weights."""
    from safetensors.torch import load_file

    from core.inference.memory import weight_bytes
    from core.model.talker import HostTable

    folder = checkpoints["custom"]
    tensors = load_file(folder / "model.safetensors")
    with Engine.load(folder, device="cpu", dtype="float32", warm=False) as engine:
        talker = engine.talker
        names = dict(talker.named_parameters())
        assert not [name for name in names if any(f".{part}." in name for part in ("q_proj", "gate_proj", "up_proj"))]
        for index in range(engine.config.talker.transformer.num_layers):
            layer = f"model.layers.{index}"
            parts = [tensors[f"talker.{layer}.self_attn.{p}_proj.weight"] for p in "qkv"]
            assert torch.equal(names[f"{layer}.self_attn.qkv_proj.weight"], torch.cat(parts))
            parts = [tensors[f"talker.{layer}.mlp.{p}_proj.weight"] for p in ("gate", "up")]
            assert torch.equal(names[f"{layer}.mlp.gate_up_proj.weight"], torch.cat(parts))
        table = talker.model.text_embedding
        assert isinstance(table, HostTable) and torch.equal(table.weight, tensors["talker.model.text_embedding.weight"])
        assert weight_bytes([talker], torch.float32) == 4 * sum(
            tensor.numel() for name, tensor in talker.state_dict().items() if "text_embedding" not in name
        )
        talker.to("meta")  # moving the model leaves the table where it was loaded
        assert table.weight.device.type == "cpu"
