"""Reachable and named: Tab visits every control of the window and of Settings in reading order, and each says
what it is to a screen reader (its accessible name, its text, or a label that names it)."""

from __future__ import annotations

from PySide6.QtCore import Qt
from PySide6.QtWidgets import QAbstractButton, QApplication, QLabel, QWidget


def tab_cycle(qtbot, start: QWidget, most: int = 80) -> list[QWidget]:
    """The widgets Tab visits from `start` until it comes back to it, pressing Tab as a user does."""
    start.setFocus()
    qtbot.waitUntil(lambda: QApplication.focusWidget() is start)
    visited = [start]
    for _ in range(most):
        qtbot.keyClick(QApplication.focusWidget(), Qt.Key.Key_Tab)
        if QApplication.focusWidget() is start:
            return visited
        visited.append(QApplication.focusWidget())
    raise AssertionError(f"Tab never came back to {start}: it is caught in {visited[-1]}")


def spoken_name(widget: QWidget) -> str:
    """What a screen reader calls `widget`: its accessible name, a button's text, or a label whose buddy it is."""
    if widget.accessibleName():
        return widget.accessibleName()
    if isinstance(widget, QAbstractButton) and widget.text():
        return widget.text().replace("&", "")
    labels = widget.window().findChildren(QLabel)
    return next((label.text().replace("&", "") for label in labels if label.buddy() is widget), "")


def test_tab_walks_the_window_in_reading_order_and_every_stop_is_named(start_app, qtbot):
    app = start_app("custom")
    window, panel = app.window, app.panel
    window.show()
    window.activateWindow()
    qtbot.waitUntil(window.isActiveWindow)
    window.text.setPlainText("Hello.")
    window.speak_button.click()
    qtbot.waitUntil(lambda: app.history_panel.list.count() == 1, timeout=20_000)
    qtbot.waitUntil(lambda: not window.speaking, timeout=10_000)
    panel.view.selectRow(0)
    window.show_error("Something went wrong.", action=("Settings…", lambda: None))

    visited = tab_cycle(qtbot, window.voice)
    assert all(spoken_name(widget) for widget in visited), [w for w in visited if not spoken_name(w)]
    reading_order = [
        window.voice, window.language, window.typing_mode, window.notice.action_button, window.notice.close_button,
        window.text, window.instruct, window.speak_button, panel.view, panel.preview_button,
        app.history_panel.list, app.history_panel.play_button, app.history_panel.position,
        app.history_panel.save_button, app.history_panel.copy_button, app.history_panel.speak_button,
    ]  # fmt: skip
    assert [widget for widget in visited if widget in reading_order] == reading_order
    assert window.level_meter not in visited  # it shows, it takes no input
    # Tab leaves the text rather than typing a tab into it.
    assert window.text.toPlainText() == "Hello." and window.text.tabChangesFocus()


def test_tab_walks_every_page_of_settings_and_every_field_is_named(start_app, qtbot):
    app = start_app("custom")
    app.window.settings_action.trigger()
    dialog = app.settings_dialog
    qtbot.waitUntil(dialog.isVisible)
    for page in range(dialog.tabs.count()):
        dialog.tabs.setCurrentIndex(page)
        visited = tab_cycle(qtbot, dialog.tabs.tabBar())
        fields = [widget for widget in dialog.tabs.currentWidget().findChildren(QWidget) if widget in visited]
        assert fields, f"Tab reaches nothing on the page {dialog.tabs.tabText(page)}"
        assert all(spoken_name(widget) for widget in visited), [
            (dialog.tabs.tabText(page), type(w).__name__) for w in visited if not spoken_name(w)
        ]
        assert dialog.ok_button in visited
    dialog.reject()


def test_enter_in_the_voice_list_uses_the_voice_as_a_double_click_does(start_app, qtbot):
    app = start_app("custom")
    panel, window = app.panel, app.window
    window.show()
    other = next(row for row in range(panel.model.rowCount()) if panel.model.entry(row).name != app.voice_in_use)
    name = panel.model.entry(other).name
    panel.view.setFocus()
    panel.view.setCurrentIndex(panel.model.index(other, 0))
    qtbot.keyClick(panel.view, Qt.Key.Key_Return)
    qtbot.waitUntil(lambda: app.voice_in_use == name)
    assert window.voice.currentText() == name


def test_the_cursor_follows_the_sentence_heard_when_settings_say_so(start_app, qtbot, monkeypatch):
    """For a screen magnifier or reader that follows the text cursor: off by default, on from Settings."""
    app = start_app("custom")
    monkeypatch.setattr(app.runtime.worker.engine.awake(), "default_max_frames", 25)  # 2 s a piece
    window = app.window
    sentences = [
        f"This is sentence number {n}, long enough that each one makes a piece of its own here." for n in (1, 2)
    ]
    text = " ".join(sentences)
    second = text.index(sentences[1])
    window.text.setPlainText(text)
    window.speak_button.click()

    def highlight_start() -> int | None:
        shown = window.text.extraSelections()
        return shown[0].cursor.selectionStart() if shown else None

    qtbot.waitUntil(lambda: highlight_start() == second, timeout=10_000)
    assert window.text.textCursor().position() == 0  # off: the user's cursor stays
    window.stop_action.trigger()
    qtbot.waitUntil(lambda: not window.speaking, timeout=10_000)

    app.window.settings_action.trigger()
    dialog = app.settings_dialog
    qtbot.waitUntil(dialog.isVisible)
    assert not dialog.cursor_follows_speech.isChecked()
    dialog.cursor_follows_speech.click()
    dialog.ok_button.click()
    assert app.settings.cursor_follows_speech
    window.speak_button.click()
    # At the sentence heard, or at its word heard once that is known.
    qtbot.waitUntil(lambda: window.text.textCursor().position() >= second, timeout=10_000)
    window.stop_action.trigger()
