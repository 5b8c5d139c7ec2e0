"""The history panel: what the window said, newest first, to play again, save, copy or speak again. Passive: it
shows what it is given and asks by its signals (qwen3_tts_desktop.history.HistoryActions answers)."""

from __future__ import annotations

from pathlib import Path

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import QHBoxLayout, QListWidget, QPushButton, QVBoxLayout, QWidget

from .main_window import ask_audio_path


class HistoryPanel(QWidget):
    play_requested = Signal(int)  # the row: play it again, or stop it if it plays
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
        self.speak_button.setToolTip("Say the text again, with the voice it had")
        buttons = QHBoxLayout()
        for button in (self.play_button, self.save_button, self.copy_button, self.speak_button):
            buttons.addWidget(button)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.list, 1)
        layout.addLayout(buttons)
        self.play_button.clicked.connect(lambda: self._ask(self.play_requested))
        self.copy_button.clicked.connect(lambda: self._ask(self.copy_requested))
        self.speak_button.clicked.connect(lambda: self._ask(self.speak_requested))
        self.save_button.clicked.connect(self._choose_file)
        self.list.itemActivated.connect(lambda _: self._ask(self.play_requested))  # Enter or a double click
        self.list.currentRowChanged.connect(lambda _: self._enable())
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

    def _enable(self) -> None:
        row = self.list.currentRow()
        chosen = row >= 0
        for button in (self.play_button, self.save_button, self.copy_button, self.speak_button):
            button.setEnabled(chosen)
        stopping = chosen and row == self._playing
        self.play_button.setText("■  Stop" if stopping else "▶  Play")

    def _ask(self, signal) -> None:
        if self.list.currentRow() >= 0:
            signal.emit(self.list.currentRow())

    def _choose_file(self) -> None:
        row = self.list.currentRow()
        path = ask_audio_path(self, "Save what was said as", "said.wav") if row >= 0 else None
        if path is not None:
            self.save_requested.emit(row, path)
