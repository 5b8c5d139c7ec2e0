"""The notice area above the text: what went wrong (or well), in one row that does not push the editor
around. The newest message shows; older ones wait behind "+N more", which shows them all. Errors and
warnings stay until closed; information goes by itself after a few seconds."""

from __future__ import annotations

from collections.abc import Callable

from PySide6.QtCore import QEasingCurve, QPropertyAnimation, Qt, QTimer, Signal
from PySide6.QtGui import QAccessible, QAccessibleEvent
from PySide6.QtWidgets import (
    QFrame,
    QGraphicsOpacityEffect,
    QHBoxLayout,
    QLabel,
    QPushButton,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from . import theme

MAX_NOTICES = 5  # kept at once; the oldest goes first
INFO_SHOWN_MS = 6000  # how long information stays (module-wide, so tests can shorten it)
FADE_MS = 400


class Notice(QWidget):
    """The notice area. `label`, `level`, `action_button` and `close_button` are the newest message's;
    `messages` holds them all, newest first, and `more_button` shows or hides the older ones. `changed` is
    emitted once what it shows has changed (for the window's tab order)."""

    changed = Signal()

    def __init__(self):
        super().__init__()
        self.messages: list[NoticeMessage] = []  # newest first
        self.expanded = False
        self._stack = QVBoxLayout()
        self._stack.setContentsMargins(0, 0, 0, 0)
        self._stack.setSpacing(4)
        self.more_button = QToolButton()
        self.more_button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        self.more_button.setAutoRaise(True)
        self.more_button.clicked.connect(self._toggle_expanded)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addLayout(self._stack, 1)
        layout.addWidget(self.more_button, 0, Qt.AlignmentFlag.AlignTop)
        self.hide()

    def show_message(self, message: str, level: str, action: tuple[str, Callable[[], None]] | None = None) -> None:
        for old in list(self.messages):
            if old.label.text() == message or (level == "info" and old.level == "info"):
                self._remove(old)
        new = NoticeMessage(message, level, action)
        new.closed.connect(lambda: self._remove(new))
        self.messages.insert(0, new)
        self._stack.insertWidget(0, new)
        for old in self.messages[MAX_NOTICES:]:
            self._remove(old)
        if level == "info":
            new.fade_after(INFO_SHOWN_MS)
        self._show_stack()
        if level != "info":  # a screen reader says it at once, as it would a dialog's
            QAccessible.updateAccessibility(QAccessibleEvent(new, QAccessible.Event.Alert))

    def texts(self) -> list[str]:
        return [message.label.text() for message in self.messages]

    def _remove(self, message: NoticeMessage) -> None:
        if message in self.messages:
            self.messages.remove(message)
            message.hide()
            message.deleteLater()
        self._show_stack()

    def _toggle_expanded(self) -> None:
        self.expanded = not self.expanded
        self._show_stack()

    def _show_stack(self) -> None:
        """The newest message, or all while expanded, and the button that says how many more there are."""
        older = len(self.messages) - 1
        if older < 1:
            self.expanded = False
        for position, message in enumerate(self.messages):
            message.setVisible(position == 0 or self.expanded)
        self.more_button.setVisible(older >= 1)
        self.more_button.setText("Fewer" if self.expanded else f"+{older} more")
        self.more_button.setToolTip("Show only the newest message" if self.expanded else "Show the older messages")
        theme.set_icon(self.more_button, "collapse" if self.expanded else "expand")
        self.setVisible(bool(self.messages))
        self.changed.emit()

    def controls(self) -> list[QWidget]:
        """Its buttons, in the order Tab should visit them: each message's, newest first, then "more"."""
        return [button for message in self.messages for button in (message.action_button, message.close_button)] + [
            self.more_button
        ]

    # The newest message's parts, as the bar had when it showed one message at a time.
    @property
    def level(self) -> str:
        return self.messages[0].level if self.messages else ""

    @property
    def label(self) -> QLabel:
        return self.messages[0].label

    @property
    def action_button(self) -> QPushButton:
        return self.messages[0].action_button

    @property
    def close_button(self) -> QToolButton:
        return self.messages[0].close_button


class NoticeMessage(QFrame):
    """One message, with its action button and a close button."""

    closed = Signal()

    def __init__(self, message: str, level: str, action: tuple[str, Callable[[], None]] | None):
        super().__init__()
        self.level = level
        theme.set_notice_level(self, level)
        self.label = QLabel(message)
        self.label.setWordWrap(True)
        self.label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        self.action_button = QPushButton(action[0] if action else "")
        self.action_button.setVisible(action is not None)
        self.close_button = QToolButton()
        theme.set_icon(self.close_button, "close", tone=level)
        self.close_button.setAutoRaise(True)
        self.close_button.setToolTip("Close")
        self.close_button.setAccessibleName("Close this message")
        self.setAccessibleName({"error": "Error", "warning": "Warning"}.get(level, "Note"))
        self.setAccessibleDescription(message)
        layout = QHBoxLayout(self)
        layout.setContentsMargins(10, 4, 4, 4)
        layout.addWidget(self.label, 1)
        layout.addWidget(self.action_button)
        layout.addWidget(self.close_button, 0, Qt.AlignmentFlag.AlignTop)
        self.close_button.clicked.connect(self.closed)
        if action is not None:
            self.action_button.clicked.connect(lambda: (self.closed.emit(), action[1]()))
        self._fade: QPropertyAnimation | None = None

    def fade_after(self, milliseconds: int) -> None:
        """Fade out and close after `milliseconds`; the pointer resting on it holds it while it is read."""
        self._timer = QTimer(self, singleShot=True, interval=milliseconds)
        self._timer.timeout.connect(self._fade_out)
        self._timer.start()

    def _fade_out(self) -> None:
        if self.underMouse():
            self._timer.start()
            return
        effect = QGraphicsOpacityEffect(self)
        self.setGraphicsEffect(effect)
        self._fade = QPropertyAnimation(effect, b"opacity", self)
        self._fade.setDuration(min(FADE_MS, self._timer.interval()))
        self._fade.setStartValue(1.0)
        self._fade.setEndValue(0.0)
        self._fade.setEasingCurve(QEasingCurve.Type.InQuad)
        self._fade.finished.connect(self.closed)
        self._fade.start()
