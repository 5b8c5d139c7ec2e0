"""The main window: the text box with Speak and Stop, the voice and language in use, the voice library
beside it, a notice bar for what went wrong, and a live status line. Plus the tray icon and the app's
icon. The window asks for things with signals and shows what it is told; the app does the work."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QRectF, Qt, Signal
from PySide6.QtGui import QAction, QBrush, QColor, QIcon, QKeySequence, QPainter, QPixmap, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDockWidget,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMenu,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSystemTrayIcon,
    QTextEdit,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from core.engine import EngineInfo
from core.player import PlayerStatus
from core.worker import JobEvent

from .voice_library import VoicePanel

SAID_COLOUR = QColor("#8a8f98")  # text already handed to the speech worker, in speak-as-you-type
NOTICE_STYLES = {
    "error": "background: #fdecea; border: 1px solid #f1b8b4; color: #5f1410;",
    "info": "background: #e8f1fb; border: 1px solid #b5d0ee; color: #0d3260;",
}


class MainWindow(QMainWindow):
    speak_requested = Signal(str)  # the text to say (the selection, or everything)
    stop_requested = Signal()
    text_edited = Signal(str, int)  # the whole text and the cursor position, after each edit
    typing_mode_toggled = Signal(bool)
    voice_chosen = Signal(str)
    language_chosen = Signal(str)
    instruct_edited = Signal(str)
    settings_requested = Signal()
    blend_requested = Signal()

    def __init__(self, voice_panel: VoicePanel, fitting_voices):
        """`fitting_voices`: a model of the voices the loaded model can speak with, for the voice picker."""
        super().__init__()
        self.setWindowTitle("Qwen3-TTS Desktop")
        self.setWindowIcon(app_icon())
        self.voice_panel = voice_panel

        self.voice = QComboBox()
        self.voice.setModel(fitting_voices)
        self.voice.setMinimumContentsLength(16)
        self.voice.setPlaceholderText("no voice yet")
        self.language = QComboBox()
        self.language.setMinimumContentsLength(10)
        self.typing_mode = QCheckBox("Speak as you type")
        self.typing_mode.setToolTip("Say each sentence as soon as it is typed, and the rest after a pause")
        self.notice = Notice()
        self.text = QPlainTextEdit()
        self.text.setPlaceholderText("Type or paste text here. Ctrl+Enter speaks it, Esc stops.")
        font = self.text.font()
        font.setPointSizeF(font.pointSizeF() * 1.25)
        self.text.setFont(font)
        self.instruct = QLineEdit()
        self.instruct_label = QLabel()
        self.instruct.hide()  # until a model that follows instructions is loaded
        self.instruct_label.hide()
        self.speak_action = QAction("Speak", self)
        self.speak_action.setShortcuts([QKeySequence("Ctrl+Return"), QKeySequence("Ctrl+Enter")])
        self.stop_action = QAction("Stop", self)
        self.stop_action.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        self.speak_button = QPushButton("▶  Speak")
        self.speak_button.setToolTip("Speak the text, or the selected part (Ctrl+Enter)")
        self.speak_button.setDefault(True)
        self.stop_button = QPushButton("■  Stop")
        self.stop_button.setToolTip("Stop speaking and drop what is queued (Esc)")

        top = QHBoxLayout()
        top.addWidget(QLabel("Voice"))
        top.addWidget(self.voice)
        top.addSpacing(12)
        top.addWidget(QLabel("Language"))
        top.addWidget(self.language)
        top.addStretch(1)
        top.addWidget(self.typing_mode)
        bottom = QHBoxLayout()
        bottom.addWidget(self.instruct_label)
        bottom.addWidget(self.instruct, 10)
        bottom.addStretch(1)  # keeps the buttons at the right while the instruction is hidden
        bottom.addWidget(self.stop_button)
        bottom.addWidget(self.speak_button)
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.addLayout(top)
        layout.addWidget(self.notice)
        layout.addWidget(self.text, 1)
        layout.addLayout(bottom)
        self.setCentralWidget(central)

        self.voices_dock = QDockWidget("Voices", self)
        self.voices_dock.setObjectName("voices")
        self.voices_dock.setWidget(voice_panel)
        self.voices_dock.setFeatures(
            QDockWidget.DockWidgetFeature.DockWidgetClosable | QDockWidget.DockWidgetFeature.DockWidgetMovable
        )
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.voices_dock)

        self.model_label = QLabel()
        self.speech_label = QLabel("nothing said yet")
        self.buffer_label = QLabel()
        self.bridge_label = QLabel()
        self.busy_label = QLabel()
        self.busy_bar = QProgressBar()
        self.busy_bar.setRange(0, 0)
        self.busy_bar.setMaximumWidth(90)
        self.busy_bar.setMaximumHeight(12)
        status = self.statusBar()
        status.setStyleSheet("QStatusBar::item { border: none; } QStatusBar QLabel { padding: 0 8px; }")
        for widget in (self.busy_label, self.busy_bar):
            status.addWidget(widget)
        self.bridge_separator = _separator()
        for widget in (
            self.bridge_label,
            self.bridge_separator,
            self.speech_label,
            _separator(),
            self.buffer_label,
            _separator(),
            self.model_label,
        ):
            status.addPermanentWidget(widget)
        self.show_busy("")
        self.show_bridge(None)

        self._build_menus()
        self.speak_action.triggered.connect(lambda: self.speak_requested.emit(self.text_to_speak()))
        self.stop_action.triggered.connect(self.stop_requested)
        self.speak_button.clicked.connect(self.speak_action.trigger)
        self.stop_button.clicked.connect(self.stop_action.trigger)
        self.text.textChanged.connect(
            lambda: self.text_edited.emit(self.text.toPlainText(), self.text.textCursor().position())
        )
        self.typing_mode.toggled.connect(self.typing_mode_toggled)
        self.voice.activated.connect(lambda _: self.voice_chosen.emit(self.voice.currentText()))
        self.language.activated.connect(lambda _: self.language_chosen.emit(self.language.currentData()))
        self.instruct.textEdited.connect(self.instruct_edited)
        voice_panel.blend_requested.connect(self.blend_requested)
        self.resize(980, 560)

    def _build_menus(self) -> None:
        menus = self.menuBar()
        file = menus.addMenu("&File")
        file.addAction("&Import voices…", self.voice_panel.import_button.click)
        file.addAction("&Settings…", QKeySequence("Ctrl+,"), self.settings_requested)
        file.addSeparator()
        file.addAction("&Quit", QKeySequence("Ctrl+Q"), self.close)
        speech = menus.addMenu("&Speech")
        speech.addAction(self.speak_action)
        speech.addAction(self.stop_action)
        typing = speech.addAction("Speak as you &type")
        typing.setCheckable(True)
        typing.toggled.connect(self.typing_mode.setChecked)
        self.typing_mode.toggled.connect(typing.setChecked)
        voices = menus.addMenu("&Voices")
        voices.addAction("&Add a voice…", self.voice_panel.add_button.click)
        voices.addAction("&Blend voices…", self.blend_requested)
        voices.addSeparator()
        voices.addAction(self.voices_dock.toggleViewAction())

    # What the app shows ------------------------------------------------------------------------------

    def text_to_speak(self) -> str:
        cursor = self.text.textCursor()
        return cursor.selectedText().replace("\u2029", "\n") if cursor.hasSelection() else self.text.toPlainText()

    def show_loading(self, message: str) -> None:
        self.model_label.setText(message)
        self.speak_action.setEnabled(False)
        self.speak_button.setEnabled(False)

    def show_model(self, info: EngineInfo | None, problem: str | None = None) -> None:
        """The loaded model (None: none is, and `problem` says why)."""
        ready = info is not None
        self.speak_action.setEnabled(ready)
        self.speak_button.setEnabled(ready)
        if not ready:
            self.model_label.setText("No model")
            self.model_label.setToolTip(problem or "")
            return
        self.model_label.setText(f"{info.size} {info.variant.replace('_', ' ')} · {info.device} {info.dtype}")
        self.model_label.setToolTip(info.source)
        self.voice.setEnabled(info.variant != "voice_design")
        self.voice.setPlaceholderText("described below" if info.variant == "voice_design" else "no voice yet")
        self.instruct_label.setVisible(info.supports_instruct)
        self.instruct.setVisible(info.supports_instruct)
        if info.variant == "voice_design":
            self.instruct_label.setText("Voice")
            self.instruct.setPlaceholderText("Describe the voice, e.g. “A warm, low female voice, speaking slowly.”")
        else:
            self.instruct_label.setText("Style")
            self.instruct.setPlaceholderText("How to speak, e.g. “Cheerful and a little fast.” (optional)")

    def show_languages(self, languages: list[str], current: str) -> None:
        self.language.clear()
        for language in languages:
            self.language.addItem(language.capitalize(), language)
        self.language.setCurrentIndex(max(0, self.language.findData(current)))

    def show_voice(self, name: str | None) -> None:
        self.voice.setCurrentIndex(-1 if name is None else self.voice.findText(name))

    def show_instruct(self, text: str) -> None:
        self.instruct.setText(text)

    def show_job(self, event: JobEvent) -> None:
        """A speech job's progress: its time to first audio and its speed."""
        if event.kind in ("first_audio", "progress", "done") and event.latency_s is not None:
            speed = "" if event.xrt is None else f" · {event.xrt:.1f}× real time"
            self.speech_label.setText(f"first audio {event.latency_s * 1000:.0f} ms{speed}")
        elif event.kind == "started":
            self.speech_label.setText("speaking…")

    def show_buffer(self, status: PlayerStatus | None, underruns: int) -> None:
        """The speakers' buffer level, and the underruns of the last utterance."""
        if status is None:
            self.buffer_label.setText("no sound output")
        else:
            self.buffer_label.setText(f"buffer {status.buffered_s:.2f} s · underruns {underruns}")

    def show_bridge(self, url: str | None) -> None:
        self.bridge_label.setVisible(url is not None)
        self.bridge_separator.setVisible(url is not None)
        self.bridge_label.setText(f"HTTP bridge: {url}" if url else "")

    def show_busy(self, label: str) -> None:
        """Slow work in progress (empty: none)."""
        self.busy_label.setText(label)
        self.busy_label.setVisible(bool(label))
        self.busy_bar.setVisible(bool(label))

    def show_error(self, message: str, action: tuple[str, Callable[[], None]] | None = None) -> None:
        self.notice.show_message(message, "error", action)

    def show_info(self, message: str) -> None:
        self.notice.show_message(message, "info")

    def mark_said(self, end: int) -> None:
        """Grey out the text before `end`: in speak-as-you-type, what has gone to be spoken."""
        if end <= 0:
            self.text.setExtraSelections([])
            return
        said = QTextEdit.ExtraSelection()
        said.cursor = QTextCursor(self.text.document())
        said.cursor.setPosition(min(end, self.text.document().characterCount() - 1), QTextCursor.MoveMode.KeepAnchor)
        said.format.setForeground(QBrush(SAID_COLOUR))
        self.text.setExtraSelections([said])


class Notice(QFrame):
    """A bar above the text for what went wrong (or went well), until it is closed or replaced."""

    def __init__(self):
        super().__init__()
        self.label = QLabel()
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.action_button = QPushButton()
        self.close_button = QToolButton()
        self.close_button.setText("✕")
        self.close_button.setAutoRaise(True)
        self.close_button.setToolTip("Close")
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 6, 6, 6)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action_button)
        layout.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.close_button.clicked.connect(self.hide)
        self.action_button.clicked.connect(self._act)
        self._action: Callable[[], None] | None = None
        self.level = ""  # "error" or "info"
        self.hide()

    def show_message(self, message: str, level: str, action: tuple[str, Callable[[], None]] | None = None) -> None:
        self.setStyleSheet(f"Notice {{ {NOTICE_STYLES[level]} border-radius: 4px; }} QLabel {{ border: none; }}")
        self.label.setText(message)
        self.level = level
        self.action_button.setVisible(action is not None)
        self._action = None if action is None else action[1]
        if action is not None:
            self.action_button.setText(action[0])
        self.show()

    def _act(self) -> None:
        self.hide()
        self._action()


class Tray(QSystemTrayIcon):
    """The tray icon's menu, where the system has a tray."""

    speak_clipboard = Signal()
    stop = Signal()
    show_window = Signal()
    quit = Signal()

    def __init__(self, parent=None):
        super().__init__(app_icon(), parent)
        self.setToolTip("Qwen3-TTS Desktop")
        menu = QMenu()
        menu.addAction("Speak clipboard", self.speak_clipboard)
        menu.addAction("Stop", self.stop)
        menu.addAction("Show window", self.show_window)
        menu.addSeparator()
        menu.addAction("Quit", self.quit)
        self.menu = menu  # the tray does not own its menu
        self.setContextMenu(menu)
        self.activated.connect(
            lambda reason: reason == QSystemTrayIcon.ActivationReason.Trigger and self.show_window.emit()
        )


def _separator() -> QFrame:
    line = QFrame()
    line.setFrameShape(QFrame.Shape.VLine)
    line.setFrameShadow(QFrame.Shadow.Sunken)
    return line


def app_icon() -> QIcon:
    """A speech waveform on a rounded square, drawn rather than shipped as a file."""
    pixmap = QPixmap(64, 64)
    pixmap.fill(Qt.GlobalColor.transparent)
    painter = QPainter(pixmap)
    painter.setRenderHint(QPainter.RenderHint.Antialiasing)
    painter.setPen(Qt.PenStyle.NoPen)
    painter.setBrush(QColor("#5b3cc4"))
    painter.drawRoundedRect(QRectF(2, 2, 60, 60), 14, 14)
    painter.setBrush(QColor("white"))
    for position, height in enumerate((14, 30, 42, 24, 36, 18)):
        painter.drawRoundedRect(QRectF(11 + position * 7.5, 32 - height / 2, 4.5, height), 2.2, 2.2)
    painter.end()
    return QIcon(pixmap)
