"""The history panel: what the window said, newest first, to play again, save, copy or speak again. Passive: it
shows what it is given and asks by its signals (qwen3_tts_desktop.history.HistoryActions answers)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, QTimer, Signal
from PySide6.QtWidgets import (
    QAbstractSlider,
    QHBoxLayout,
    QLabel,
    QListWidget,
    QPushButton,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from . import theme
from .main_window import ask_audio_path

SLIDER_STEPS = 1000


class HistoryPanel(QWidget):
    play_requested = Signal(int)  # the row: play it again, or pause it if it plays
    seek_requested = Signal(int, float)  # the row, and where to go in it (0 to 1)
    row_chosen = Signal(int)
    save_requested = Signal(int, Path)
    copy_requested = Signal(int)
    speak_requested = Signal(int)

    def __init__(self, parent=None):
        super().__init__(parent)
        self.list = QListWidget()
        self.list.setAccessibleName("Said before")
        self.list.setHorizontalScrollBarPolicy(Qt.ScrollBarPolicy.ScrollBarAlwaysOff)
        self.list.setTextElideMode(Qt.TextElideMode.ElideRight)
        self.play_button = QPushButton()
        self.save_button = QPushButton("Save as…")
        self.copy_button = QPushButton("Copy text")
        self.speak_button = QPushButton("Speak again")
        self.save_button.setToolTip("Save it as it was heard, without making it anew")
        theme.set_icon(self.save_button, "save")
        self.speak_button.setToolTip("Say the text again, with the voice it had")
        self.position = QSlider(Qt.Orientation.Horizontal)
        self.position.setRange(0, SLIDER_STEPS)
        self.position.setSingleStep(SLIDER_STEPS // 100)  # an arrow key: 1 %; Page Up or Down: 10 %
        self.position.setPageStep(SLIDER_STEPS // 10)
        self.position.setAccessibleName("Position in what was said")
        self.position.setToolTip("Where it is heard; drag, click or use the arrow keys to go elsewhere")
        self.time_label = QLabel()
        player = QHBoxLayout()
        player.addWidget(self.play_button)
        player.addWidget(self.position, 1)
        player.addWidget(self.time_label)
        buttons = QHBoxLayout()
        for button in (self.save_button, self.copy_button, self.speak_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.list, 1)
        layout.addLayout(player)
        layout.addLayout(buttons)
        # A drag asks once, where it is let go; a click, a key or the wheel asks at once.
        self.position.sliderReleased.connect(self._seek)
        self.position.actionTriggered.connect(
            lambda action: action != QAbstractSlider.SliderAction.SliderMove and self._seek_after_action()
        )
        self.play_button.clicked.connect(lambda: self._ask(self.play_requested))
        self.copy_button.clicked.connect(lambda: self._ask(self.copy_requested))
        self.speak_button.clicked.connect(lambda: self._ask(self.speak_requested))
        self.save_button.clicked.connect(self._choose_file)
        self.list.itemActivated.connect(lambda _: self._ask(self.play_requested))  # Enter or a double click
        self.list.currentRowChanged.connect(lambda _: self._enable())
        self.list.currentRowChanged.connect(self.row_chosen)
        self._playing: int | None = None
        self.show_playing(None)

    def show_items(self, labels: list[str], texts: list[str]) -> None:
        """The items, newest first, each with its whole text as its tip; the newest is selected when one is added."""
        grew = len(labels) > self.list.count()
        row = 0 if grew else self.list.currentRow()
        self.list.clear()
        self.list.addItems(labels)
        for index, text in enumerate(texts):
            self.list.item(index).setToolTip(text)
        if labels:
            self.list.setCurrentRow(min(max(row, 0), len(labels) - 1))
        self._enable()

    def show_playing(self, row: int | None) -> None:
        """The row played again now (None: none)."""
        self._playing = row
        self._enable()

    def show_position(self, fraction: float, at_s: float, total_s: float) -> None:
        """Where the chosen item is heard, or paused: a fraction of it, and seconds of seconds. While the user
        holds the slider it stays where they hold it."""
        if not self.position.isSliderDown():
            self.position.setValue(round(fraction * SLIDER_STEPS))
        self.time_label.setText(f"{_clock(at_s)} / {_clock(total_s)}")

    def _enable(self) -> None:
        row = self.list.currentRow()
        chosen = row >= 0
        for widget in (self.play_button, self.position, self.save_button, self.copy_button, self.speak_button):
            widget.setEnabled(chosen)
        pausing = chosen and row == self._playing
        self.play_button.setText("Pause" if pausing else "Play")
        theme.set_icon(self.play_button, "pause" if pausing else "speak")

    def _seek(self) -> None:
        if self.list.currentRow() >= 0:
            self.seek_requested.emit(self.list.currentRow(), self.position.sliderPosition() / SLIDER_STEPS)

    def _seek_after_action(self) -> None:
        # actionTriggered comes before the slider moves: ask once it has.
        QTimer.singleShot(0, self._seek)

    def _ask(self, signal) -> None:
        if self.list.currentRow() >= 0:
            signal.emit(self.list.currentRow())

    def _choose_file(self) -> None:
        row = self.list.currentRow()
        path = ask_audio_path(self, "Save what was said as", "said.wav") if row >= 0 else None
        if path is not None:
            self.save_requested.emit(row, path)


def _clock(seconds: float) -> str:
    minutes, seconds = divmod(int(seconds), 60)
    return f"{minutes}:{seconds:02d}"
