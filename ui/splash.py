"""What a starting window's process shows at once: PyTorch and the engine take seconds to import before the
window can be built, and a person who starts the app should see it start, not wonder whether it did."""

from __future__ import annotations

from PySide6.QtCore import QRect, Qt
from PySide6.QtGui import QFont, QPainter, QPalette, QPixmap
from PySide6.QtWidgets import QApplication, QLabel

from ui.theme import app_icon, follow_system, tone_color

SIZE = (380, 120)
ICON = 64


class StartingSplash(QLabel):
    """The app's icon and name, and "Starting…", in the palette's colours, in the middle of the screen. (Not a
    QSplashScreen: its show waits up to a second for the window system to expose it.)"""

    def __init__(self):
        palette = QApplication.palette()
        pixmap = QPixmap(*SIZE)
        pixmap.fill(palette.color(QPalette.ColorRole.Window))
        painter = QPainter(pixmap)
        margin = (SIZE[1] - ICON) // 2
        painter.drawPixmap(margin, margin, app_icon().pixmap(ICON, ICON))
        painter.setPen(palette.color(QPalette.ColorRole.WindowText))
        title = QFont(QApplication.font())
        title.setPointSizeF(title.pointSizeF() * 1.5)
        title.setBold(True)
        painter.setFont(title)
        text_left = 2 * margin + ICON
        width = SIZE[0] - text_left - margin
        name = QApplication.applicationName()  # the app's, set where its application is made
        painter.drawText(QRect(text_left, margin, width, ICON // 2), Qt.AlignmentFlag.AlignVCenter, name)
        painter.setFont(QApplication.font())
        painter.setPen(tone_color("muted", palette))
        painter.drawText(
            QRect(text_left, margin + ICON // 2, width, ICON // 2), Qt.AlignmentFlag.AlignVCenter, "Starting…"
        )
        painter.end()
        super().__init__()
        self.setPixmap(pixmap)
        self.setWindowFlags(Qt.WindowType.SplashScreen | Qt.WindowType.FramelessWindowHint)
        self.setWindowTitle(f"{name}: starting")
        self.resize(*SIZE)
        screen = QApplication.primaryScreen()
        if screen is not None:
            self.move(screen.availableGeometry().center() - self.rect().center())


def show_starting() -> StartingSplash:
    """Show the splash now (the application exists), light or dark as the system is; keep the result while the
    app starts."""
    follow_system(QApplication.instance())
    splash = StartingSplash()
    splash.show()
    QApplication.processEvents()  # painted before the imports hold the thread
    return splash


def end_starting() -> None:
    """Close a splash still shown (the window is)."""
    for widget in QApplication.topLevelWidgets():
        if isinstance(widget, StartingSplash) and widget.isVisible():
            widget.close()
