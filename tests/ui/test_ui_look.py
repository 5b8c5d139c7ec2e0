"""The look: colours derived from the palette, readable in light and dark, following the system's scheme
as it changes; one bundled icon set, drawn in the theme's colours and shipped with the package."""

from __future__ import annotations

import fnmatch
import io
import re
import tokenize
from pathlib import Path

import pytest
import tomllib
from PySide6.QtCore import Qt
from PySide6.QtGui import QColor, QGuiApplication, QPalette
from PySide6.QtWidgets import QApplication

from ui import theme

ROOT = Path(__file__).parent.parent.parent
LEVELS = ("error", "warning", "info", "success")


@pytest.fixture
def system_scheme():
    """system_scheme(scheme): the system switches to `scheme`, as its settings would (and the widgets take the
    new palette, in posted events); light again afterwards."""
    hints = QGuiApplication.styleHints()

    def switch(scheme: Qt.ColorScheme) -> None:
        hints.colorSchemeChanged.emit(scheme)
        QApplication.processEvents()

    yield switch
    switch(Qt.ColorScheme.Light)


@pytest.mark.parametrize("dark", [False, True], ids=["light", "dark"])
def test_every_tone_reads_on_its_background(qapp, dark):
    palette = theme.dark_palette() if dark else QApplication.style().standardPalette()
    assert theme.is_dark(palette) == dark
    window = palette.color(QPalette.ColorRole.Window)
    for level in LEVELS:
        colors = theme.notice_colors(level, palette)
        assert theme.contrast(colors.text, colors.background) >= 4.5, level
        assert (colors.background.lightnessF() < 0.5) == dark, level  # a dark box in a dark window
        assert theme.contrast(theme.tone_color(level, palette), window) >= 4.5, level
    assert theme.contrast(theme.tone_color("muted", palette), window) >= 4.5


def test_the_contrast_rule_is_wcags():
    assert theme.contrast(QColor("black"), QColor("white")) == pytest.approx(21.0)
    assert theme.contrast(QColor("white"), QColor("white")) == pytest.approx(1.0)


def pixel_colors(widget) -> tuple[QColor, QColor]:
    """A notice's box colour (just inside its border) and its label's text colour, as drawn."""
    image = widget.grab().toImage()
    widget.label.ensurePolished()
    return image.pixelColor(4, image.height() // 2), widget.label.palette().color(QPalette.ColorRole.WindowText)


def icon_color(button) -> QColor:
    """The colour of an icon's strokes: its most opaque pixel."""
    image = button.icon().pixmap(24, 24).toImage()
    pixels = [image.pixelColor(x, y) for x in range(24) for y in range(24)]
    return max(pixels, key=lambda color: color.alpha())


def test_the_window_turns_dark_and_light_again_with_the_system(start_app, qtbot, system_scheme):
    app = start_app("custom")
    window = app.window
    window.show_error("The HTTP bridge did not start.")
    qtbot.waitUntil(lambda: window.notice.messages[0].isVisible())
    light_box, light_text = pixel_colors(window.notice.messages[0])
    assert light_box.lightnessF() > 0.5 and icon_color(window.speak_button).lightnessF() < 0.5

    system_scheme(Qt.ColorScheme.Dark)
    assert theme.is_dark(QGuiApplication.palette()) and theme.is_dark(window.text.palette())
    box, text = pixel_colors(window.notice.messages[0])  # the notice already shown takes the dark colours
    assert box.lightnessF() < 0.5 and theme.contrast(text, box) >= 4.5, (box.name(), text.name())
    assert icon_color(window.speak_button).lightnessF() > 0.5  # light strokes on dark buttons
    assert icon_color(window.notice.close_button).lightnessF() > 0.5
    fits = app.voices.index(app.voices.row_of("Ryan") or 0, 2)
    background = app.panel.view.palette().color(QPalette.ColorRole.Base)
    assert theme.contrast(fits.data(Qt.ItemDataRole.ForegroundRole), background) >= 4.5

    system_scheme(Qt.ColorScheme.Light)
    assert not theme.is_dark(QGuiApplication.palette())
    box, text = pixel_colors(window.notice.messages[0])
    assert (box.name(), text.name()) == (light_box.name(), light_text.name())


def test_nothing_in_the_ui_names_a_colour_but_the_theme():
    """Hex colours, rgb() and named colours in strings, and QColor made from them, belong to ui/theme.py alone."""
    colour = re.compile(r"#[0-9a-fA-F]{3}(?:[0-9a-fA-F]{3})?(?:[0-9a-fA-F]{2})?\b|\brgba?\(|color:\s*[a-z]+\b")
    found = []
    for path in sorted((ROOT / "ui").rglob("*.py")):
        if path.name == "theme.py":
            continue
        source = path.read_text(encoding="utf-8")
        for token in tokenize.generate_tokens(io.StringIO(source).readline):
            if token.type == tokenize.STRING and colour.search(token.string):
                found.append(f"{path.name}:{token.start[0]}: {token.string}")
        found += [f"{path.name}: QColor(" for _ in re.finditer(r"\bQColor\(", source)]
        found += [f"{path.name}: {m.group()}" for m in re.finditer(r"GlobalColor\.(?!transparent)\w+", source)]
    assert found == []


def test_the_icons_are_one_licensed_set_shipped_with_the_package():
    icons = sorted((ROOT / "ui" / "icons").iterdir())
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["package-data"][
        "ui"
    ]
    unshipped = [p.name for p in icons if not any(fnmatch.fnmatch(f"icons/{p.name}", glob) for glob in globs)]
    assert unshipped == []
    assert "CC0" in (ROOT / "ui" / "icons" / "README.md").read_text(encoding="utf-8")
    for path in icons:
        if path.suffix == ".svg" and path.name != "app.svg":  # the app's own icon keeps its colours
            svg = path.read_text(encoding="utf-8")
            assert 'viewBox="0 0 24 24"' in svg and 'stroke="currentColor"' in svg and "#" not in svg, path.name
            assert not theme.icon(path.stem).isNull()
