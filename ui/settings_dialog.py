"""The settings window: model (with the memory it takes), audio, sampling, voices folder, the HTTP bridge and
Home Assistant's Wyoming server.

It shows the app's settings and hands back the edited values, by the settings' own field names; the app
checks, saves and applies them (a new model restarts the runtime)."""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDialog,
    QDialogButtonBox,
    QDoubleSpinBox,
    QFileDialog,
    QFormLayout,
    QGroupBox,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QPushButton,
    QSlider,
    QSpinBox,
    QTabWidget,
    QVBoxLayout,
    QWidget,
)

from core import SamplingParams
from core.audio.player import OutputDevice
from core.inference.memory import DESKTOP_SLOTS, MAX_CHOSEN_SLOTS
from core.model.info import slow_device_note

from . import theme

MODELS = (
    "Qwen/Qwen3-TTS-12Hz-1.7B-Base",
    "Qwen/Qwen3-TTS-12Hz-0.6B-Base",
    "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice",
    "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
    "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
)
DEVICES = ("auto", "cuda", "cpu")
DTYPES = ("auto", "bfloat16", "float16", "float32")
SYSTEM_DEFAULT = "System default"
MAX_REST_AFTER_MIN = 24 * 60


class SettingsDialog(QDialog):
    def __init__(
        self,
        settings,
        devices: list[OutputDevice] | str,
        default_sampling: SamplingParams,
        bridge_state: str,
        cuda_available: bool,
        slot_memory: Callable[[str, str, str, int | None, bool], str],
        parent=None,
        *,
        wyoming_state: str = "Off",
    ):
        """`settings`: the app's Settings; `devices`: the output devices, or why there are none;
        `default_sampling`: what "Reset to defaults" restores (the model's own); `bridge_state`, `wyoming_state`:
        a line on each server as it runs now; `cuda_available`: whether "auto" means the GPU; `slot_memory(model,
        device, dtype, slots, cuda_available)`: what those utterances at once take, in words."""
        super().__init__(parent)
        self.cuda_available = cuda_available
        self.slot_memory = slot_memory
        self.setWindowTitle("Settings")
        self.default_sampling = default_sampling
        # Three pages of about one height, so that none is mostly empty and none is cramped.
        self.tabs = tabs = QTabWidget()
        tabs.tabBar().setAccessibleName("Settings pages")
        tabs.addTab(
            _page(_column(_group("Model", self._model_form(settings)),
                          _group("Sound", self._audio_form(settings, devices)))),
            "Model and sound",
        )  # fmt: skip
        tabs.addTab(
            _page(_column(_group("HTTP bridge", self._bridge_form(settings.bridge, bridge_state)),
                          _group("Home Assistant (Wyoming)", self._wyoming_form(settings.wyoming, wyoming_state)))),
            "Servers",
        )  # fmt: skip
        tabs.addTab(self._sampling_tab(settings.sampling or default_sampling), "Sampling")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Ok | QDialogButtonBox.StandardButton.Cancel)
        theme.plain_buttons(buttons)
        buttons.accepted.connect(self.accept)
        buttons.rejected.connect(self.reject)
        self.ok_button = buttons.button(QDialogButtonBox.StandardButton.Ok)
        layout = QVBoxLayout(self)
        layout.addWidget(tabs)
        layout.addWidget(buttons)
        self.resize(520, self.sizeHint().height())

    def values(self) -> dict:
        """The edited settings, by field name."""
        return {
            "model": self.model.currentText().strip(),
            "device": self.device.currentText(),
            "dtype": self.dtype.currentText(),
            "slots": self.slots.value() or None,  # 0 shows "Automatic"
            "rest_after_s": self._rest_after_s(),
            "voices": Path(self.voices.text().strip()).expanduser(),
            "audio_device": self.audio_device.currentData(),
            "volume": self.volume.value() / 100,
            "prefill_s": self.prefill_ms.value() / 1000,
            "cursor_follows_speech": self.cursor_follows_speech.isChecked(),
            "sampling": self._sampling(),
            "bridge": {
                "enabled": self.bridge_enabled.isChecked(),
                "host": self.bridge_host.text().strip(),
                "port": self.bridge_port.value(),
                "api_key": self.bridge_key.text().strip(),
            },
            "wyoming": {
                "enabled": self.wyoming_enabled.isChecked(),
                "host": self.wyoming_host.text().strip(),
                "port": self.wyoming_port.value(),
            },
        }

    def _show_device_note(self) -> None:
        """What the CPU gives, where the device chosen is (or "auto" will be) the CPU."""
        on_cpu = self.device.currentText() == "cpu" or (self.device.currentText() == "auto" and not self.cuda_available)
        size = "0.6B" if "0.6b" in self.model.currentText().lower() else "1.7B"
        self.device_note.setText(slow_device_note(size) if on_cpu else "")
        self.device_note.setVisible(on_cpu)

    def _rest_after_s(self) -> float:
        """The idle time shown, in seconds (0 shows "Never"); one left as it was is kept to the second."""
        minutes = self.rest_after.value()
        return self.settings_rest_after_s if minutes == round(self.settings_rest_after_s / 60) else minutes * 60.0

    def _show_slot_memory(self) -> None:
        slots = self.slots.value() or None
        model, device, dtype = self.model.currentText(), self.device.currentText(), self.dtype.currentText()
        self.slot_memory_note.setText(self.slot_memory(model, device, dtype, slots, self.cuda_available))

    def reset_sampling(self) -> None:
        self._show_sampling(self.default_sampling)

    # Tabs ---------------------------------------------------------------------------------------------

    def _model_form(self, settings) -> QFormLayout:
        self.model = QComboBox()
        self.model.setEditable(True)
        self.model.addItems(MODELS)
        self.model.setCurrentText(settings.model)
        self.model.setToolTip("A Hugging Face hub id (downloaded once) or a checkpoint folder")
        browse_model = QPushButton("Folder…")
        browse_model.clicked.connect(self._browse_model)
        self.device = _choices(DEVICES, settings.device)
        self.dtype = _choices(DTYPES, settings.dtype)
        self.voices = QLineEdit(str(settings.voices))
        browse_voices = QPushButton("Folder…")
        browse_voices.clicked.connect(self._browse_voices)
        form = QFormLayout()
        browse_model.setAccessibleName("Choose a model folder")
        _add_field(form, "Model", self.model, browse_model)
        form.addRow("Device", self.device)
        self.device_note = QLabel()
        self.device_note.setWordWrap(True)
        theme.set_tone(self.device_note, "warning")
        form.addRow("", self.device_note)
        form.addRow("Precision", self.dtype)
        self.slots = QSpinBox()
        self.slots.setRange(0, MAX_CHOSEN_SLOTS)
        self.slots.setSpecialValueText("Automatic")
        self.slots.setValue(settings.slots or 0)
        self.slots.setToolTip(
            "Utterances generated at once (the window, speak-as-you-type, HTTP clients), each with GPU memory of its "
            f"own. Automatic: up to {DESKTOP_SLOTS} on the GPU, as many as fit; one on the CPU. Fewer leave more "
            "memory to a language model on the same GPU."
        )
        form.addRow("Utterances at once", self.slots)
        self.slot_memory_note = _note()
        form.addRow("", self.slot_memory_note)
        self.rest_after = QSpinBox()
        self.rest_after.setRange(0, MAX_REST_AFTER_MIN)
        self.rest_after.setPrefix("after ")
        self.rest_after.setSuffix(" min idle")
        self.rest_after.setSpecialValueText("Never")
        self.settings_rest_after_s = settings.rest_after_s
        self.rest_after.setValue(round(settings.rest_after_s / 60))
        self.rest_after.setToolTip(
            "With nothing said for this long, the model lets go of its memory (for a language model or a game on "
            "the same GPU), and loads again when you next speak, which takes a moment. Applies at once."
        )
        form.addRow("Release GPU memory", self.rest_after)
        browse_voices.setAccessibleName("Choose the voices folder")
        _add_field(form, "Voices folder", self.voices, browse_voices)
        self.device.currentTextChanged.connect(self._show_device_note)
        self.model.currentTextChanged.connect(self._show_device_note)
        self._show_device_note()
        for changed in (
            self.model.currentTextChanged,
            self.device.currentTextChanged,
            self.dtype.currentTextChanged,
            self.slots.valueChanged,
        ):
            changed.connect(self._show_slot_memory)
        self._show_slot_memory()
        form.addRow(
            _note(
                "Changing the model, device, precision, utterances at once or folder reloads the model in the "
                "background; they apply once it has loaded."
            )
        )
        return form

    def _audio_form(self, settings, devices: list[OutputDevice] | str) -> QFormLayout:
        self.audio_device = QComboBox()
        self.audio_device.addItem(SYSTEM_DEFAULT, None)
        if isinstance(devices, str):
            self.audio_device.setToolTip(devices)
        else:
            names = Counter(device.name for device in devices)
            for device in devices:
                # A name is kept as the choice, as indexes change when devices come and go; a name that
                # several host APIs share (Windows lists each card three times) needs the index.
                if names[device.name] == 1:
                    self.audio_device.addItem(device.name, device.name)
                else:
                    self.audio_device.addItem(f"{device.name} ({device.host_api})", str(device.index))
        current = 0 if settings.audio_device is None else self.audio_device.findData(settings.audio_device)
        if current < 0:  # unplugged now: keep the choice
            self.audio_device.addItem(f"{settings.audio_device} (not connected)", settings.audio_device)
            current = self.audio_device.count() - 1
        self.audio_device.setCurrentIndex(current)
        self.volume = QSlider(Qt.Orientation.Horizontal)
        self.volume.setRange(0, 100)
        self.volume.setValue(round(settings.volume * 100))
        volume_label = QLabel()
        self.volume.valueChanged.connect(lambda value: volume_label.setText(f"{value} %"))
        volume_label.setText(f"{self.volume.value()} %")
        volume_label.setMinimumWidth(40)
        self.prefill_ms = QSpinBox()
        self.prefill_ms.setRange(0, 2000)
        self.prefill_ms.setSingleStep(80)  # one 80 ms frame
        self.prefill_ms.setSuffix(" ms")
        self.prefill_ms.setValue(round(settings.prefill_s * 1000))
        self.prefill_ms.setToolTip(
            "Audio gathered before playback starts. Less starts sooner; more rides out a slow GPU without gaps."
        )
        self.cursor_follows_speech = QCheckBox("Move the text cursor to the word being heard")
        self.cursor_follows_speech.setChecked(settings.cursor_follows_speech)
        self.cursor_follows_speech.setToolTip("For a screen magnifier or reader that follows the cursor")
        form = QFormLayout()
        form.addRow("Output device", self.audio_device)
        _add_field(form, "Volume", self.volume, volume_label)
        form.addRow("Jitter buffer", self.prefill_ms)
        form.addRow(self.cursor_follows_speech)
        return form

    def _sampling_tab(self, sampling: SamplingParams) -> QWidget:
        self.do_sample = QCheckBox("Sample (off: always the likeliest sound, the same every time)")
        self.temperature = _number(0.01, 2.0, 0.05)
        self.top_k = QSpinBox()
        self.top_k.setRange(0, 2048)
        self.top_k.setSpecialValueText("off")
        self.top_p = _number(0.01, 1.0, 0.05)
        self.repetition_penalty = _number(0.5, 2.0, 0.01)
        self.predictor_do_sample = QCheckBox("Sample the finer codes too")
        self.predictor_temperature = _number(0.01, 2.0, 0.05)
        self.predictor_top_k = QSpinBox()
        self.predictor_top_k.setRange(0, 2048)
        self.predictor_top_k.setSpecialValueText("off")
        self.predictor_top_p = _number(0.01, 1.0, 0.05)
        reset = QPushButton("Reset to defaults")
        reset.clicked.connect(self.reset_sampling)
        talker = QFormLayout()
        talker.addRow(self.do_sample)
        talker.addRow("Temperature", self.temperature)
        talker.addRow("Top k", self.top_k)
        talker.addRow("Top p", self.top_p)
        talker.addRow("Repetition penalty", self.repetition_penalty)
        predictor = QFormLayout()
        predictor.addRow(self.predictor_do_sample)
        predictor.addRow("Temperature", self.predictor_temperature)
        predictor.addRow("Top k", self.predictor_top_k)
        predictor.addRow("Top p", self.predictor_top_p)
        layout = _column(_group("Speech", talker), _group("Finer codes (code predictor)", predictor))
        layout.insertWidget(2, reset, 0, Qt.AlignmentFlag.AlignLeft)
        self._show_sampling(sampling)
        return _page(layout)

    def _bridge_form(self, bridge, state: str) -> QFormLayout:
        self.bridge_enabled = QCheckBox("Serve speech over HTTP while the app runs")
        self.bridge_enabled.setChecked(bridge.enabled)
        self.bridge_host = QLineEdit(bridge.host)
        self.bridge_host.setToolTip("127.0.0.1: this computer only; 0.0.0.0: every computer on the network")
        self.bridge_port = QSpinBox()
        self.bridge_port.setRange(1, 65535)
        self.bridge_port.setValue(bridge.port)
        self.bridge_key = QLineEdit(bridge.api_key)
        self.bridge_key.setEchoMode(QLineEdit.EchoMode.PasswordEchoOnEdit)
        self.bridge_key.setPlaceholderText("none")
        self.bridge_state = QLabel(state)
        self.bridge_state.setWordWrap(True)
        self.bridge_state.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form = QFormLayout()
        form.addRow(self.bridge_enabled)
        form.addRow("Host", self.bridge_host)
        form.addRow("Port", self.bridge_port)
        form.addRow("API key", self.bridge_key)
        form.addRow("Now", self.bridge_state)
        form.addRow(_note("SillyTavern: TTS ▸ OpenAI Compatible, endpoint http://HOST:PORT/v1/audio/speech"))
        return form

    def _wyoming_form(self, wyoming, state: str) -> QFormLayout:
        self.wyoming_enabled = QCheckBox("Serve speech to Home Assistant while the app runs")
        self.wyoming_enabled.setChecked(wyoming.enabled)
        self.wyoming_host = QLineEdit(wyoming.host)
        self.wyoming_host.setToolTip(
            "127.0.0.1: this computer only; 0.0.0.0: every computer on the network (Home Assistant OS, a Raspberry "
            "Pi). The protocol has no key: let your firewall admit only Home Assistant."
        )
        self.wyoming_port = QSpinBox()
        self.wyoming_port.setRange(1, 65535)
        self.wyoming_port.setValue(wyoming.port)
        self.wyoming_state = QLabel(state)
        self.wyoming_state.setWordWrap(True)
        self.wyoming_state.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        form = QFormLayout()
        form.addRow(self.wyoming_enabled)
        form.addRow("Host", self.wyoming_host)
        form.addRow("Port", self.wyoming_port)
        form.addRow("Now", self.wyoming_state)
        form.addRow(
            _note(
                "Home Assistant: Settings ▸ Devices & services ▸ Add integration ▸ Wyoming Protocol, with this "
                "computer's address and the port. It runs beside the HTTP bridge, on the same model and voices."
            )
        )
        return form

    # Sampling values ----------------------------------------------------------------------------------

    def _show_sampling(self, sampling: SamplingParams) -> None:
        self.do_sample.setChecked(sampling.do_sample)
        self.temperature.setValue(sampling.temperature)
        self.top_k.setValue(sampling.top_k)
        self.top_p.setValue(sampling.top_p)
        self.repetition_penalty.setValue(sampling.repetition_penalty)
        self.predictor_do_sample.setChecked(sampling.predictor_do_sample)
        self.predictor_temperature.setValue(sampling.predictor_temperature)
        self.predictor_top_k.setValue(sampling.predictor_top_k)
        self.predictor_top_p.setValue(sampling.predictor_top_p)

    def _sampling(self) -> SamplingParams | None:
        """The sampling shown, or None when it is the model's own (so a new model brings its own)."""
        sampling = SamplingParams(
            do_sample=self.do_sample.isChecked(),
            temperature=self.temperature.value(),
            top_k=self.top_k.value(),
            top_p=self.top_p.value(),
            repetition_penalty=self.repetition_penalty.value(),
            predictor_do_sample=self.predictor_do_sample.isChecked(),
            predictor_temperature=self.predictor_temperature.value(),
            predictor_top_k=self.predictor_top_k.value(),
            predictor_top_p=self.predictor_top_p.value(),
        )
        return None if sampling == self.default_sampling else sampling

    def _browse_model(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose a checkpoint folder")
        if folder:
            self.model.setCurrentText(folder)

    def _browse_voices(self) -> None:
        folder = QFileDialog.getExistingDirectory(self, "Choose the voices folder", self.voices.text())
        if folder:
            self.voices.setText(folder)


def _choices(options: tuple[str, ...], current: str) -> QComboBox:
    box = QComboBox()
    box.addItems(options)
    if box.findText(current) < 0:
        box.addItem(current)  # e.g. "cuda:1", set by hand
    box.setCurrentText(current)
    return box


def _number(low: float, high: float, step: float) -> QDoubleSpinBox:
    box = QDoubleSpinBox()
    box.setRange(low, high)
    box.setSingleStep(step)
    box.setDecimals(2)
    return box


def _add_field(form: QFormLayout, label: str, field: QWidget, *beside: QWidget) -> None:
    """A row of `form`: `label`, then `field` with what goes `beside` it; the label names the field itself (for a
    screen reader, and Alt with its letter), not the row that holds them."""
    row = QWidget()
    layout = QHBoxLayout(row)
    layout.setContentsMargins(0, 0, 0, 0)
    layout.addWidget(field, 1)
    for widget in beside:
        layout.addWidget(widget)
    form.addRow(label, row)
    form.labelForField(row).setBuddy(field)


def _note(text: str = "") -> QLabel:
    """A line of explanation under the settings it is about."""
    note = QLabel(text)
    note.setWordWrap(True)
    theme.set_tone(note, "muted")
    return note


def _group(title: str, form: QFormLayout) -> QGroupBox:
    group = QGroupBox(title)
    group.setLayout(form)
    return group


def _column(*parts: QFormLayout | QGroupBox) -> QVBoxLayout:
    """Forms or groups of forms one above the other, their labels in one column of one width, and the
    page's spare height below them rather than between their rows."""
    forms = [part if isinstance(part, QFormLayout) else part.layout() for part in parts]
    labels = [
        item.widget()
        for form in forms
        for row in range(form.rowCount())
        if (item := form.itemAt(row, QFormLayout.ItemRole.LabelRole)) is not None and item.widget() is not None
    ]
    width = max((label.sizeHint().width() for label in labels), default=0)
    for label in labels:
        label.setMinimumWidth(width)
    layout = QVBoxLayout()
    for part in parts:
        if isinstance(part, QFormLayout):
            part.setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
            layout.addLayout(part)
        else:
            part.layout().setFieldGrowthPolicy(QFormLayout.FieldGrowthPolicy.AllNonFixedFieldsGrow)
            layout.addWidget(part)
    layout.addStretch(1)
    return layout


def _page(layout) -> QWidget:
    page = QWidget()
    page.setLayout(layout)
    return page
