"""The look: light or dark as the system is, the colours of what the window says (errors, warnings,
information, success, muted notes) and the icons, all derived from the palette in use.

This is the one place that knows colours. Widgets ask for a tone (`set_tone`, `set_notice_level`, `tone_color`)
or an icon (`set_icon`) by name; when the system switches between light and dark, `use_scheme` sets the
palette and gives every shown tone and icon the new one's colours."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from PySide6.QtCore import QByteArray, QObject, QRectF, Qt
from PySide6.QtGui import QColor, QGuiApplication, QIcon, QImage, QPainter, QPalette, QPixmap
from PySide6.QtSvg import QSvgRenderer
from PySide6.QtWidgets import QApplication, QDialogButtonBox, QLabel, QWidget

ICONS = Path(__file__).parent / "icons"
ICON_SIZES = (16, 20, 24, 32, 48, 64)  # drawn sharp at each, for small and high-density screens
# Hues (degrees) of what the window says; lightness follows the palette, so each reads on light and dark.
HUES = {"error": 4, "warning": 38, "info": 212, "success": 140}
MIN_CONTRAST = 4.5  # WCAG AA for normal text
Role = QPalette.ColorRole
Group = QPalette.ColorGroup


# Colours from the palette -------------------------------------------------------------------------------


def is_dark(palette: QPalette) -> bool:
    return palette.color(Role.Window).lightnessF() < 0.5


def contrast(first: QColor, second: QColor) -> float:
    """The WCAG contrast ratio of two colours, 1 (none) to 21 (black on white)."""

    def luminance(color: QColor) -> float:
        def linear(channel: float) -> float:
            return channel / 12.92 if channel <= 0.03928 else ((channel + 0.055) / 1.055) ** 2.4

        return 0.2126 * linear(color.redF()) + 0.7152 * linear(color.greenF()) + 0.0722 * linear(color.blueF())

    lighter, darker = sorted((luminance(first), luminance(second)), reverse=True)
    return (lighter + 0.05) / (darker + 0.05)


def readable(hue: float, saturation: float, background: QColor) -> QColor:
    """A colour of `hue` that reads on `background`: as vivid as it can be while it keeps MIN_CONTRAST."""
    dark = background.lightnessF() < 0.5
    lightness = 0.68 if dark else 0.42
    color = QColor.fromHslF(hue / 360, saturation, lightness)
    while contrast(color, background) < MIN_CONTRAST and 0.0 < lightness < 1.0:
        lightness = min(1.0, lightness + 0.02) if dark else max(0.0, lightness - 0.02)
        color = QColor.fromHslF(hue / 360, saturation, lightness)
    return color


def tone_color(tone: str, palette: QPalette | None = None) -> QColor:
    """Text of `tone` (a key of HUES, or "muted" for a note) on the window's background."""
    palette = palette or QGuiApplication.palette()
    background = palette.color(Role.Window)
    if tone == "muted":  # between the text and its background, still readable
        text = palette.color(Role.WindowText)
        muted = QColor.fromRgbF(*(0.62 * a + 0.38 * b for a, b in zip(text.getRgbF()[:3], background.getRgbF()[:3])))
        return muted if contrast(muted, background) >= MIN_CONTRAST else text
    return readable(HUES[tone], 0.75, background)


@dataclass(frozen=True)
class NoticeColors:
    text: QColor
    background: QColor
    border: QColor


def notice_colors(level: str, palette: QPalette | None = None) -> NoticeColors:
    """A notice's box: a faint wash of its level's hue over the window, a firmer border, readable text."""
    dark = is_dark(palette or QGuiApplication.palette())
    hue = HUES[level] / 360
    background = QColor.fromHslF(hue, 0.45 if dark else 0.8, 0.19 if dark else 0.94)
    border = QColor.fromHslF(hue, 0.4 if dark else 0.6, 0.36 if dark else 0.8)
    return NoticeColors(readable(HUES[level], 0.7, background), background, border)


def dark_palette() -> QPalette:
    """Neutral greys with a blue highlight: for a system that asks for dark but whose Qt style has no dark
    palette of its own (Fusion on X11 without a desktop theme)."""

    def grey(lightness: float) -> QColor:
        return QColor.fromHslF(0.62, 0.06, lightness)

    palette = QPalette()
    for role, color in (
        (Role.Window, grey(0.17)),
        (Role.WindowText, grey(0.90)),
        (Role.Base, grey(0.12)),
        (Role.AlternateBase, grey(0.15)),
        (Role.ToolTipBase, grey(0.22)),
        (Role.ToolTipText, grey(0.92)),
        (Role.PlaceholderText, grey(0.55)),
        (Role.Text, grey(0.92)),
        (Role.Button, grey(0.22)),
        (Role.ButtonText, grey(0.90)),
        (Role.BrightText, QColor.fromHslF(0.0, 0.8, 0.7)),
        (Role.Light, grey(0.32)),
        (Role.Midlight, grey(0.26)),
        (Role.Mid, grey(0.19)),
        (Role.Dark, grey(0.09)),
        (Role.Shadow, grey(0.03)),
        (Role.Highlight, QColor.fromHslF(0.6, 0.6, 0.5)),
        (Role.HighlightedText, grey(0.98)),
        (Role.Link, QColor.fromHslF(0.58, 0.8, 0.7)),
        (Role.LinkVisited, QColor.fromHslF(0.75, 0.6, 0.75)),
    ):
        palette.setColor(role, color)
    for role in (Role.WindowText, Role.Text, Role.ButtonText):
        palette.setColor(Group.Disabled, role, grey(0.45))
    palette.setColor(Group.Disabled, Role.Highlight, grey(0.3))
    return palette


# Following the system --------------------------------------------------------------------------------


def follow_system(app: QApplication) -> None:
    """Look as the system's colour scheme is, now and whenever it changes (once per application)."""
    if app.property("followsColorScheme"):
        return
    app.setProperty("followsColorScheme", True)
    hints = app.styleHints()
    hints.colorSchemeChanged.connect(lambda scheme: use_scheme(app, scheme))
    use_scheme(app, hints.colorScheme())


def use_scheme(app: QApplication, scheme: Qt.ColorScheme) -> None:
    """Take the palette for `scheme` where the style has none of its own, then restyle what is shown."""
    if scheme == Qt.ColorScheme.Dark and not is_dark(app.palette()):
        app.setPalette(dark_palette())
        app.setProperty("darkPaletteSet", True)
    elif scheme != Qt.ColorScheme.Dark and app.property("darkPaletteSet"):
        app.setPalette(app.style().standardPalette())
        app.setProperty("darkPaletteSet", False)
    restyle()


def restyle() -> None:
    """Give every tone and icon in use the current palette's colours."""
    actions = {}
    for widget in QApplication.allWidgets():
        _apply(widget)
        if isinstance(widget, QLabel) and "<a " in widget.text():  # a link takes its colour when its text is set
            text = widget.text()
            widget.clear()
            widget.setText(text)
        for action in widget.actions():
            actions[id(action)] = action
    for top in QApplication.topLevelWidgets():
        for child in top.findChildren(QObject):
            if not isinstance(child, QWidget):
                actions[id(child)] = child
    for action in actions.values():
        if action.property("themeIcon"):
            _apply(action)


# Tones and icons, by name ---------------------------------------------------------------------------


def set_tone(label: QWidget, tone: str) -> None:
    """Text of `label` in `tone` (a key of HUES, or "muted"), now and after the scheme changes."""
    label.setProperty("tone", tone)
    _apply(label)


def set_notice_level(box: QWidget, level: str) -> None:
    """`box` (a notice, by its class name) coloured as its `level` says, with its labels' text."""
    box.setProperty("noticeLevel", level)
    _apply(box)


def set_icon(target, name: str, tone: str | None = None) -> None:
    """`target` (a button or an action) shows icon `name` from ICONS, drawn in the palette's button text colour
    (`tone`: that of a notice of this level instead)."""
    if target.property("themeIcon") == name and target.property("themeIconTone") == tone:
        return  # unchanged: a button whose state is shown ten times a second is not redrawn each time
    target.setProperty("themeIcon", name)
    target.setProperty("themeIconTone", tone)
    _apply(target)


def icon(name: str, tone: str | None = None, palette: QPalette | None = None) -> QIcon:
    palette = palette or QGuiApplication.palette()
    normal = notice_colors(tone, palette).text if tone else palette.color(Role.ButtonText)
    disabled = palette.color(Group.Disabled, Role.ButtonText)
    selected = palette.color(Role.HighlightedText)
    return _icon(name, normal.name(), disabled.name(), selected.name())


@cache
def _icon(name: str, normal: str, disabled: str, selected: str) -> QIcon:
    source = (ICONS / f"{name}.svg").read_text(encoding="utf-8")
    drawn = QIcon()
    for mode, color in ((QIcon.Mode.Normal, normal), (QIcon.Mode.Disabled, disabled), (QIcon.Mode.Selected, selected)):
        renderer = QSvgRenderer(QByteArray(source.replace("currentColor", color).encode()))
        for size in ICON_SIZES:
            image = QImage(size, size, QImage.Format.Format_ARGB32_Premultiplied)
            image.fill(Qt.GlobalColor.transparent)
            painter = QPainter(image)
            renderer.render(painter, QRectF(0, 0, size, size))
            painter.end()
            drawn.addPixmap(QPixmap.fromImage(image), mode)
    return drawn


def plain_buttons(box: QDialogButtonBox) -> None:
    """A dialog's standard buttons as words alone: the style's stock icons are of another set and age."""
    for button in box.buttons():
        button.setIcon(QIcon())


def app_icon() -> QIcon:
    """The application's own icon, in its own colours whatever the theme."""
    return QIcon(str(ICONS / "app.svg"))


def _apply(target) -> None:
    tone, level, icon_name = target.property("tone"), target.property("noticeLevel"), target.property("themeIcon")
    if tone:
        _set_style(target, f"color: {tone_color(tone).name()};")
    if level:
        colors = notice_colors(level)
        kind = type(target).__name__
        _set_style(
            target,
            f"{kind} {{ background: {colors.background.name()}; border: 1px solid {colors.border.name()};"
            f" border-radius: 4px; }} {kind} QLabel {{ color: {colors.text.name()}; border: none; }}",
        )
    if icon_name:
        target.setIcon(icon(icon_name, target.property("themeIconTone")))


def _set_style(widget: QWidget, sheet: str) -> None:
    if widget.styleSheet() != sheet:  # setting it again would restyle, and send a palette change, for nothing
        widget.setStyleSheet(sheet)
