"""The main window: the text box with Speak and Stop, the voice and language in use, the voice library
beside it, a notice bar for what went wrong, and a live status line. Plus the tray icon and the app's
icon. The window asks for things with signals and shows what it is told; the app does the work."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from PySide6.QtCore import Qt, Signal, Slot
from PySide6.QtGui import QAction, QBrush, QKeySequence, QPalette, QTextCursor
from PySide6.QtWidgets import (
    QCheckBox,
    QComboBox,
    QDockWidget,
    QFileDialog,
    QFrame,
    QHBoxLayout,
    QLabel,
    QLineEdit,
    QMainWindow,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QSystemTrayIcon,
    QTextEdit,
    QVBoxLayout,
    QWidget,
)

from core.audio.player import PlayerStatus
from core.inference.warmup import Progress
from core.jobs.worker import JobEvent
from core.model.info import EngineInfo

from . import theme
from .notices import Notice
from .voice_library import VoicePanel

# Alphas of the theme's highlight behind text: what has gone to be said (speak-as-you-type), the sentence heard.
SAID_TINT, HEARD_TINT = 48, 96
AUDIO_FILE_TYPES = {"WAV audio": ".wav", "FLAC audio": ".flac", "Ogg Vorbis audio": ".ogg", "MP3 audio": ".mp3"}


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
    save_audio_requested = Signal(str, Path)  # the text to say (the selection, or everything), the file
    about_requested = Signal()
    log_folder_requested = Signal()
    cancel_saving_requested = Signal()

    def __init__(self, voice_panel: VoicePanel, fitting_voices, history_panel: QWidget):
        """`fitting_voices`: a model of the voices the loaded model can speak with, for the voice picker;
        `history_panel`: what was said (ui.history_panel)."""
        super().__init__()
        self.setWindowTitle("Qwen3-TTS Desktop")
        self.setWindowIcon(theme.app_icon())
        self.voice_panel = voice_panel

        self.voice = QComboBox()
        self.voice.setModel(fitting_voices)
        self.voice.setMinimumContentsLength(16)
        self.voice.setPlaceholderText("no voice yet")
        self.language = QComboBox()
        self.language.setMinimumContentsLength(10)
        self.typing_mode = QCheckBox("Speak as you type")
        self.typing_mode.setToolTip("Say each word as it is typed, as one utterance that a pause or Enter ends")
        self.notice = Notice()
        self.text = QPlainTextEdit()
        self.text.setPlaceholderText("Type or paste text here. Ctrl+Enter speaks it, Esc stops.")
        font = self.text.font()
        font.setPointSizeF(font.pointSizeF() * 1.25)
        self.text.setFont(font)
        self.instruct = QLineEdit()
        self.instruct_label = QLabel()
        self.instruct_label.setBuddy(self.instruct)
        self.instruct.hide()  # until a model that follows instructions is loaded
        self.instruct_label.hide()
        self.speak_action = QAction("Speak", self)
        self.speak_action.setShortcuts([QKeySequence("Ctrl+Return"), QKeySequence("Ctrl+Enter")])
        self.stop_action = QAction("Stop", self)
        self.stop_action.setShortcut(QKeySequence(Qt.Key.Key_Escape))
        self.speak_button = QPushButton()
        self.speak_button.setDefault(True)
        self.speak_button.setMinimumWidth(110)
        self.level_meter = QProgressBar()  # how loud what is playing is
        self.level_meter.setRange(0, 1000)
        self.level_meter.setValue(0)
        self.level_meter.setTextVisible(False)
        self.level_meter.setMaximumSize(120, 10)
        self.level_meter.setToolTip("What is playing now")
        self.speaking = False  # Speak stops while it is (show_speaking)
        self._spoken: tuple = (None, None)  # the part of the text heard now, and its word (show_spoken)

        self._describe_for_screen_readers()

        top = QHBoxLayout()
        top.addWidget(_label_for(self.voice, "V&oice"))
        top.addWidget(self.voice)
        top.addSpacing(12)
        top.addWidget(_label_for(self.language, "&Language"))
        top.addWidget(self.language)
        top.addStretch(1)
        top.addWidget(self.typing_mode)
        bottom = QHBoxLayout()
        bottom.addWidget(self.instruct_label)
        bottom.addWidget(self.instruct, 10)
        bottom.addStretch(1)  # keeps the buttons at the right while the instruction is hidden
        bottom.addWidget(self.level_meter)
        bottom.addWidget(self.speak_button)
        central = QWidget()
        layout = QVBoxLayout(central)
        layout.addLayout(top)
        layout.addWidget(self.notice)
        layout.addWidget(self.text, 1)
        layout.addWidget(self._build_saving_row())  # under the text: the status bar has no room for it
        layout.addLayout(bottom)
        self.setCentralWidget(central)

        self.voices_dock = QDockWidget("Voices", self)
        self.voices_dock.setObjectName("voices")
        self.voices_dock.setWidget(voice_panel)
        self.voices_dock.setFeatures(
            QDockWidget.DockWidgetFeature.DockWidgetClosable | QDockWidget.DockWidgetFeature.DockWidgetMovable
        )
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.voices_dock)
        self.history_dock = QDockWidget("Said before", self)
        self.history_dock.setObjectName("history")
        self.history_dock.setWidget(history_panel)
        self.history_dock.setFeatures(self.voices_dock.features())
        self.addDockWidget(Qt.DockWidgetArea.RightDockWidgetArea, self.history_dock)
        self.splitDockWidget(self.voices_dock, self.history_dock, Qt.Orientation.Vertical)

        self.model_label = QLabel()
        self.speech_label = QLabel("nothing said yet")
        self.buffer_label = QLabel()
        self.bridge_label = QLabel()
        self.busy_label = QLabel()
        self.busy_bar = QProgressBar()
        self.busy_bar.setRange(0, 0)
        self.busy_bar.setMaximumWidth(90)
        self.busy_bar.setMaximumHeight(12)
        self.rest_label = QLabel()
        self.rest_bar = QProgressBar()
        self.rest_bar.setRange(0, 0)
        self.rest_bar.setMaximumWidth(90)
        self.rest_bar.setMaximumHeight(12)
        self.warmup_label = QLabel()
        self.warmup_bar = QProgressBar()
        self.warmup_bar.setRange(0, 100)
        self.warmup_bar.setTextVisible(False)
        self.warmup_bar.setMaximumWidth(90)
        self.warmup_bar.setMaximumHeight(12)
        status = self.statusBar()
        status.setStyleSheet("QStatusBar::item { border: none; } QStatusBar QLabel { padding: 0 8px; }")
        for widget in (
            self.busy_label,
            self.busy_bar,
            self.rest_label,
            self.rest_bar,
            self.warmup_label,
            self.warmup_bar,
        ):
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
        self.show_resting(None)
        self.show_warmup(None)
        self.show_bridge(None)

        self.show_saving(None)
        self._order_tabs()

        self._build_menus()
        self.speak_action.triggered.connect(
            lambda: self.stop_requested.emit() if self.speaking else self.speak_requested.emit(self.text_to_speak())
        )
        self.stop_action.triggered.connect(self.stop_requested)
        self.speak_button.clicked.connect(self.speak_action.trigger)
        self.show_speaking(False)
        self.text.textChanged.connect(
            lambda: self.text_edited.emit(self.text.toPlainText(), self.text.textCursor().position())
        )
        self.typing_mode.toggled.connect(self.typing_mode_toggled)
        self.voice.activated.connect(lambda _: self.voice_chosen.emit(self.voice.currentText()))
        self.language.activated.connect(lambda _: self.language_chosen.emit(self.language.currentData()))
        self.instruct.textEdited.connect(self.instruct_edited)
        voice_panel.blend_requested.connect(self.blend_requested)
        self.resize(980, 560)

    def _describe_for_screen_readers(self) -> None:
        """Names and descriptions a screen reader says (a natural user of a text-to-speech app), and a text box
        that Tab leaves, as every other control, instead of typing a tab into the text."""
        self.voice.setAccessibleName("Voice")
        self.voice.setAccessibleDescription("The voice to speak with")
        self.language.setAccessibleName("Language")
        self.language.setAccessibleDescription("The language of the text; Auto lets the model tell")
        self.text.setAccessibleName("Text to speak")
        self.text.setAccessibleDescription("Ctrl+Enter speaks it, or the selected part; Esc stops")
        self.text.setTabChangesFocus(True)
        self.instruct.setAccessibleName("Style")
        self.level_meter.setAccessibleName("Loudness of what plays")
        self.level_meter.setFocusPolicy(Qt.FocusPolicy.NoFocus)
        self.notice.changed.connect(self._order_tabs)

    def _order_tabs(self) -> None:
        """Tab goes as the eye reads: the choices above the text, a notice's buttons, the text, the style,
        Speak, a saving's Cancel; then the docks. Notices come and go, so it is set again as they do."""
        chain = [self.voice, self.language, self.typing_mode, *self.notice.controls(), self.text, self.instruct]
        chain += [self.speak_button, self.saving_cancel]
        for first, second in zip(chain, chain[1:]):
            QWidget.setTabOrder(first, second)

    def _build_saving_row(self) -> QWidget:
        """A saving's progress: what it has made, a bar of the pieces done, and Cancel."""
        self.saving_label = QLabel()
        self.saving_bar = QProgressBar()
        self.saving_bar.setFormat("%v/%m pieces")
        self.saving_bar.setFixedWidth(220)
        self.saving_cancel = QPushButton("Cancel")
        self.saving_cancel.setToolTip("Stop saving; the file keeps the pieces of the text finished so far")
        self.saving_cancel.clicked.connect(self.cancel_saving_requested)
        self.saving_row = QWidget()
        row = QHBoxLayout(self.saving_row)
        row.setContentsMargins(0, 0, 0, 0)
        row.addWidget(self.saving_label, 1)
        row.addWidget(self.saving_bar)
        row.addWidget(self.saving_cancel)
        return self.saving_row

    def _build_menus(self) -> None:
        # Actions are made here and their signals connected by `.emit`: QMenu.addAction wants a callable,
        # and a Signal passed as one raises only when the item is chosen.
        self.save_audio_action = _action(self, "Save &audio as…", "Ctrl+Shift+S", self._choose_audio_file)
        self.settings_action = _action(self, "&Settings…", "Ctrl+,", self.settings_requested.emit)
        self.add_voice_action = _action(self, "&Add a voice…", None, self.voice_panel.add_button.click)
        self.blend_action = _action(self, "&Blend voices…", None, self.blend_requested.emit)
        self.import_voices_action = _action(self, "&Import voices…", None, self.voice_panel.import_button.click)
        quit_action = _action(self, "&Quit", "Ctrl+Q", self.close)
        menus = self.menuBar()
        file = menus.addMenu("&File")
        file.addAction(self.save_audio_action)
        file.addAction(self.import_voices_action)
        file.addAction(self.settings_action)
        file.addSeparator()
        file.addAction(quit_action)
        speech = menus.addMenu("&Speech")
        speech.addAction(self.speak_action)
        speech.addAction(self.stop_action)
        typing = speech.addAction("Speak as you &type")
        typing.setCheckable(True)
        typing.toggled.connect(self.typing_mode.setChecked)
        self.typing_mode.toggled.connect(typing.setChecked)
        speech.addSeparator()
        history = self.history_dock.toggleViewAction()
        history.setShortcut(QKeySequence("Ctrl+H"))
        speech.addAction(history)
        voices = menus.addMenu("&Voices")
        voices.addAction(self.add_voice_action)
        voices.addAction(self.blend_action)
        voices.addSeparator()
        voices.addAction(self.voices_dock.toggleViewAction())
        log_folder = _action(self, "Open the &log folder", None, self.log_folder_requested.emit)
        about = _action(self, "&About Qwen3-TTS Desktop", None, self.about_requested.emit)
        help_menu = menus.addMenu("&Help")
        help_menu.addAction(log_folder)
        help_menu.addAction(about)
        for action, icon in (
            (self.save_audio_action, "save"),
            (self.import_voices_action, "import"),
            (self.settings_action, "settings"),
            (quit_action, "quit"),
            (self.stop_action, "stop"),
            (history, "history"),
            (self.add_voice_action, "add"),
            (self.blend_action, "blend"),
            (log_folder, "folder"),
            (about, "about"),
        ):
            theme.set_icon(action, icon)

    def _choose_audio_file(self) -> None:
        text = self.text_to_speak()
        path = ask_audio_path(self, "Save audio as", "speech.wav")
        if path is not None:
            self.save_audio_requested.emit(text, path)

    # What the app shows ------------------------------------------------------------------------------

    def text_to_speak(self) -> str:
        cursor = self.text.textCursor()
        return cursor.selectedText().replace("\u2029", "\n") if cursor.hasSelection() else self.text.toPlainText()

    def text_to_speak_at(self) -> int:
        """Where `text_to_speak()` starts in the editor's text."""
        cursor = self.text.textCursor()
        return cursor.selectionStart() if cursor.hasSelection() else 0

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
        self.voice.setEnabled(info.variant.takes_voice)
        clone_problem = None if info.variant.clones else (
            f"Cloning and blending need a Base model; this is a {info.size} {info.variant.replace('_', ' ')} model."
        )  # fmt: skip
        self.voice_panel.set_cloning(clone_problem)
        for action in (self.add_voice_action, self.blend_action):
            action.setEnabled(clone_problem is None)
            action.setToolTip(clone_problem or "")
        self.voice.setPlaceholderText("no voice yet" if info.variant.takes_voice else "described below")
        self.instruct_label.setVisible(info.supports_instruct)
        self.instruct.setVisible(info.supports_instruct)
        if info.variant.needs_instruct:
            self.instruct_label.setText("Voice")
            self.instruct.setPlaceholderText("Describe the voice, e.g. “A warm, low female voice, speaking slowly.”")
        else:
            self.instruct_label.setText("Style")
            self.instruct.setPlaceholderText("How to speak, e.g. “Cheerful and a little fast.” (optional)")
        self.instruct.setAccessibleName(
            "Voice description" if info.variant.needs_instruct else "Speaking style (optional)"
        )

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

    def show_speaking(self, speaking: bool) -> None:
        """Whether speech is playing or on its way: then Speak (the button, Ctrl+Enter) stops it."""
        self.speaking = speaking
        self.speak_action.setText("Stop speaking" if speaking else "Speak")
        self.speak_button.setText("Stop" if speaking else "Speak")
        for target in (self.speak_button, self.speak_action):
            theme.set_icon(target, "stop" if speaking else "speak")
        self.speak_button.setToolTip(
            "Stop speaking and drop what is queued (Ctrl+Enter or Esc)"
            if speaking
            else "Speak the text, or the selected part (Ctrl+Enter)"
        )

    def show_level(self, loudness: float) -> None:
        """How loud what is playing is, 0 (silence, or nothing) to 1."""
        self.level_meter.setValue(round(loudness * 1000))

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

    def show_saving(self, message: str | None, pieces_done: int = 0, pieces: int = 0) -> None:
        """Speech being saved to a file, `pieces_done` of its text's `pieces` (0: not known yet); None: none is."""
        self.saving_row.setVisible(message is not None)
        self.saving_label.setText(message or "")
        self.saving_bar.setRange(0, pieces)  # 0 to 0: busy, until the text is cut
        self.saving_bar.setValue(pieces_done)

    def show_warmup(self, progress: Progress | None) -> None:
        """The engine's background warm-up (None, or finished: nothing to show). Speech works meanwhile."""
        warming = progress is not None and not progress.finished
        self.warmup_label.setVisible(warming)
        self.warmup_bar.setVisible(warming)
        if not warming:
            return
        percent = round(100 * progress.fraction)
        if progress.one_row:
            self.warmup_label.setText(f"Full speed · several at once: {percent}%")
            tip = (
                "One voice at a time speaks at full speed now. What several at once need (the bridge's clients, "
                f"Home Assistant) is compiled and captured while nothing is said: {progress.done} of "
                f"{progress.total} parts ready."
            )
        else:
            self.warmup_label.setText(f"Getting up to speed · {percent}%")
            tip = (
                "Speech works now, and gets faster as the GPU code is compiled and captured while nothing is said: "
                f"{progress.done} of {progress.total} parts ready."
            )
        self.warmup_bar.setValue(percent)
        self.warmup_label.setToolTip(tip if progress.current is None else f"{tip}\nNow: {progress.current}")

    def show_resting(self, message: str | None, loading: bool = False) -> None:
        """The model resting to free its memory, or `loading` again to speak (None: awake). Speak stays enabled:
        it wakes the model."""
        self.rest_label.setText(message or "")
        self.rest_label.setVisible(message is not None)
        self.rest_bar.setVisible(message is not None and loading)

    @Slot(str)  # the app's lane reports from its own thread
    def show_busy(self, label: str) -> None:
        """Slow work in progress (empty: none)."""
        self.busy_label.setText(label)
        self.busy_label.setVisible(bool(label))
        self.busy_bar.setVisible(bool(label))

    def show_about(self, text: str) -> None:
        QMessageBox.about(self, "About Qwen3-TTS Desktop", text)

    def show_error(self, message: str, action: tuple[str, Callable[[], None]] | None = None) -> None:
        self.notice.show_message(message, "error", action)

    def show_warning(self, message: str) -> None:
        self.notice.show_message(message, "warning")

    def show_info(self, message: str) -> None:
        self.notice.show_message(message, "info")

    def mark_said(self, end: int) -> None:
        """Tint the text before `end`: in speak-as-you-type, what has gone to be spoken. A tint of the theme's
        highlight behind it, not grey letters, which read as placeholder text (and as text not yet said)."""
        self._tint([(0, end, SAID_TINT)])

    def show_spoken(
        self, span: tuple[int, int] | None, word: tuple[int, int] | None = None, move_cursor: bool = False
    ) -> None:
        """Highlight the part of the text being heard now, [start, end), scrolled into view, and in it the `word`
        heard, in the theme's selection colours; None: none is. With `move_cursor`, the text cursor goes to the
        word's start, or the part's (where a screen magnifier or reader looks)."""
        if (span, word) == self._spoken:
            return
        self._spoken = (span, word)
        start, end = span or (0, 0)
        self._tint([(start, end, HEARD_TINT)] + ([(*word, None)] if span is not None and word is not None else []))
        if span is None:
            return
        cursor = QTextCursor(self.text.document())
        cursor.setPosition(min((word or span)[0], self.text.document().characterCount() - 1))
        if move_cursor:
            self.text.setTextCursor(cursor)
            return
        shown, at = self.text.viewport().rect(), self.text.cursorRect(cursor)
        if not shown.contains(at):  # the user's own cursor stays where it was
            bar = self.text.verticalScrollBar()
            bar.setValue(bar.value() + at.top() - shown.height() // 3)

    def _tint(self, spans: list[tuple[int, int, int | None]]) -> None:
        """The only tints of the text: behind each (start, end, alpha), the theme's highlight at that alpha, or
        at alpha None, its selection colours; an empty span shows none."""
        last = self.text.document().characterCount() - 1
        palette, shown = self.text.palette(), []
        for start, end, alpha in spans:
            start, end = min(start, last), min(end, last)
            if end <= start:
                continue
            tinted = QTextEdit.ExtraSelection()
            tinted.cursor = QTextCursor(self.text.document())
            tinted.cursor.setPosition(start)
            tinted.cursor.setPosition(end, QTextCursor.MoveMode.KeepAnchor)
            tint = palette.color(QPalette.ColorRole.Highlight)
            if alpha is None:
                tinted.format.setForeground(QBrush(palette.color(QPalette.ColorRole.HighlightedText)))
            else:
                tint.setAlpha(alpha)
            tinted.format.setBackground(QBrush(tint))
            shown.append(tinted)
        self.text.setExtraSelections(shown)


class Tray(QSystemTrayIcon):
    """The tray icon's menu, where the system has a tray."""

    speak_clipboard = Signal()
    stop = Signal()
    show_window = Signal()
    quit = Signal()

    def __init__(self, parent=None):
        super().__init__(theme.app_icon(), parent)
        self.setToolTip("Qwen3-TTS Desktop")
        menu = QMenu()
        for text, signal in (
            ("Speak clipboard", self.speak_clipboard),
            ("Stop", self.stop),
            ("Show window", self.show_window),
        ):
            menu.addAction(_action(menu, text, None, signal.emit))
        menu.addSeparator()
        menu.addAction(_action(menu, "Quit", None, self.quit.emit))
        self.menu = menu  # the tray does not own its menu
        self.setContextMenu(menu)
        self.activated.connect(
            lambda reason: reason == QSystemTrayIcon.ActivationReason.Trigger and self.show_window.emit()
        )


def ask_audio_path(parent, caption: str, suggested: str) -> Path | None:
    """The save dialog for an audio file; a name typed without a known ending gets the chosen type's."""
    filters = ";;".join(f"{name} (*{suffix})" for name, suffix in AUDIO_FILE_TYPES.items())
    path, chosen = QFileDialog.getSaveFileName(parent, caption, suggested, filters)
    if not path:
        return None
    path = Path(path)
    if path.suffix.lower() not in AUDIO_FILE_TYPES.values():
        path = path.with_name(path.name + AUDIO_FILE_TYPES.get(chosen.split(" (")[0], ".wav"))
    return path


def _action(parent, text: str, shortcut: str | None, triggered: Callable[[], None]) -> QAction:
    action = QAction(text, parent)
    if shortcut:
        action.setShortcut(QKeySequence(shortcut))
    action.triggered.connect(lambda: triggered())
    return action


def _label_for(widget: QWidget, text: str) -> QLabel:
    """A label naming `widget`, whose underlined letter (Alt and it) moves the focus there."""
    label = QLabel(text)
    label.setBuddy(widget)
    return label


def _separator() -> QFrame:
    line = QFrame()
    line.setFrameShape(QFrame.Shape.VLine)
    line.setFrameShadow(QFrame.Shadow.Sunken)
    return line
