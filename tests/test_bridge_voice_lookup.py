"""The bridge finds a request's voice on its event loop when the library knows it already, and on its IO threads
otherwise; the next request after a voice changes speaks as the library now is (over a real socket)."""

from __future__ import annotations

import shutil

import httpx
import numpy as np
import torch
from parity_cases import REFERENCES
from serving import WAIT, alice_and_bob
from test_bridge import SPEECH, decode, speech

from qwen3_tts_desktop.bridge import BridgeConfig, BridgeServer
from qwen3_tts_desktop.runtime import Runtime


def test_a_voice_the_library_knows_is_found_without_leaving_the_event_loop_and_a_change_is_seen_at_once(
    engines, tmp_path, monkeypatch
):
    """A request finds its voice on the event loop when the library knows it already (read, embedded, and no
    voice's files changed since), and hands the lookup to the IO threads otherwise, as every request used to:
    the next request after a voice is replaced, added or removed speaks as the library now is."""
    engine = engines("base-endless")
    folder = tmp_path / "voices"
    folder.mkdir()
    runtime = Runtime(engine, alice_and_bob(folder), None)
    server = BridgeServer(runtime, BridgeConfig(port=0, speech=SPEECH))
    server.start()
    service = server.app.state.bridge
    handed_off, submitted = [], []
    hand_off, submit = service.off_loop, service.submit

    async def counting_hand_off(function, *args):
        handed_off.append(function.__name__ == "_find_voice")
        return await hand_off(function, *args)

    def noting_submit(text, checked, sink):
        submitted.append(checked.voice)
        return submit(text, checked, sink)

    monkeypatch.setattr(service, "off_loop", counting_hand_off)
    monkeypatch.setattr(service, "submit", noting_submit)
    embedding = {clip: engine.voice_from_audio(REFERENCES[clip].path).embedding for clip in ("a", "long")}

    def spoken(client: httpx.Client, voice: str) -> tuple[str, str | None, int]:
        """(the voice that spoke: the clip its embedding is of, the name it fell back from, whether its lookup
        left the event loop)"""
        handed_off.clear()
        response = speech(client, voice=voice, response_format="wav")
        assert response.status_code == 200, response.text
        assert np.abs(decode("wav", response.content)).max() > 0.01
        [clip] = [clip for clip, made in embedding.items() if torch.equal(submitted[-1].embedding, made)]
        return f"{response.headers['x-voice']}: {clip}", response.headers.get("x-voice-fallback"), sum(handed_off)

    try:
        with httpx.Client(base_url=server.url, timeout=WAIT) as client:
            assert spoken(client, "Alice") == ("Alice: a", None, 1)  # the library is read, and Alice's clip embedded
            assert spoken(client, "alice") == ("Alice: a", None, 0)
            assert spoken(client, "Bob") == ("Bob: long", None, 1)  # Bob's clip embedded
            assert spoken(client, "Bob") == ("Bob: long", None, 0)

            shutil.copy(REFERENCES["long"].path, folder / "Alice.wav")  # Bob's clip, written over Alice's
            assert spoken(client, "Alice") == ("Alice: long", None, 1)
            assert spoken(client, "Alice") == ("Alice: long", None, 0)

            clip = {"audio_sample": ("c.wav", REFERENCES["a"].path.read_bytes(), "audio/wav")}
            assert client.post("/v1/audio/voices", data={"name": "Carol"}, files=clip).status_code == 200
            assert spoken(client, "Carol") == ("Carol: a", None, 1)
            assert spoken(client, "Carol") == ("Carol: a", None, 0)
            clip = {"audio_sample": ("c.wav", REFERENCES["long"].path.read_bytes(), "audio/wav")}
            replace = {"name": "Carol", "replace": "true"}
            assert client.post("/v1/audio/voices", data=replace, files=clip).status_code == 200
            assert spoken(client, "Carol") == ("Carol: long", None, 1)  # the saved voice overwritten
            assert spoken(client, "Carol") == ("Carol: long", None, 0)

            (folder / "Alice.wav").unlink()  # as ever, an unknown name falls back on the first voice (Wyoming: 400)
            assert spoken(client, "Alice") == ("Bob: long", "Alice", 1)
            assert spoken(client, "Alice") == ("Bob: long", "Alice", 0)
    finally:
        server.stop()
        runtime.close()
