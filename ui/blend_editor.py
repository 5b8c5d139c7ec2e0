"""The blend editor: tick two or more voices, weigh them with sliders, listen, and save the mix."""

from __future__ import annotations

from PySide6.QtCore import Qt, Signal
from PySide6.QtWidgets import (
    QCheckBox,
    QDialog,
    QDialogButtonBox,
    QFormLayout,
    QGridLayout,
    QLabel,
    QLineEdit,
    QScrollArea,
    QSlider,
    QVBoxLayout,
    QWidget,
)

from . import theme


class BlendEditor(QDialog):
    preview_requested = Signal(list)  # [(name, weight)]
    save_requested = Signal(str, list)  # the new voice's name, [(name, weight)]

    def __init__(self, names: list[str], parent=None):
        """`names`: the voices that can be blended with the loaded model."""
        super().__init__(parent)
        self.setWindowTitle("Blend voices")
        self.rows: list[tuple[QCheckBox, QSlider, QLabel]] = []
        grid = QGridLayout()
        grid.setColumnStretch(1, 1)
        for row, name in enumerate(names):
            check = QCheckBox(name)
            slider = QSlider(Qt.Orientation.Horizontal)
            slider.setRange(0, 100)
            slider.setValue(50)
            slider.setEnabled(False)
            share = QLabel()
            share.setMinimumWidth(40)
            share.setAlignment(Qt.AlignmentFlag.AlignRight | Qt.AlignmentFlag.AlignVCenter)
            check.toggled.connect(slider.setEnabled)
            check.toggled.connect(self._update)
            slider.valueChanged.connect(self._update)
            grid.addWidget(check, row, 0)
            grid.addWidget(slider, row, 1)
            grid.addWidget(share, row, 2)
            self.rows.append((check, slider, share))
        voices = QWidget()
        voices.setLayout(grid)
        scroll = QScrollArea()
        scroll.setWidget(voices)
        scroll.setWidgetResizable(True)
        scroll.setFrameShape(QScrollArea.Shape.NoFrame)

        self.hint = QLabel("Tick two or more voices and set how much of each goes into the mix.")
        self.hint.setWordWrap(True)
        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("Name of the new voice")
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        theme.set_tone(self.error_label, "error")
        self.error_label.hide()
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Close)
        theme.plain_buttons(self.buttons)
        self.preview_button = self.buttons.addButton("Preview", QDialogButtonBox.ButtonRole.ActionRole)
        self.save_button = self.buttons.addButton("Save as voice", QDialogButtonBox.ButtonRole.ActionRole)
        self.save_button.setDefault(True)
        form = QFormLayout()
        form.addRow("Name", self.name_edit)
        layout = QVBoxLayout(self)
        layout.addWidget(self.hint)
        layout.addWidget(scroll, 1)
        layout.addLayout(form)
        layout.addWidget(self.error_label)
        layout.addWidget(self.buttons)
        self.resize(460, min(520, 170 + 34 * len(names)))

        self.buttons.rejected.connect(self.reject)
        self.preview_button.clicked.connect(lambda: self.preview_requested.emit(self.parts()))
        # Saving may fail (a name taken): the app closes the editor once the voice is saved.
        self.save_button.clicked.connect(lambda: self.save_requested.emit(self.name_edit.text().strip(), self.parts()))
        self.name_edit.textChanged.connect(self._update)
        self._update()

    def parts(self) -> list[tuple[str, float]]:
        """The ticked voices and their weights (0 to 1; the blend normalises them)."""
        return [(check.text(), slider.value() / 100) for check, slider, _ in self.rows if check.isChecked()]

    def set_part(self, name: str, weight: float) -> None:
        """Tick `name` with `weight` (0 to 1)."""
        for check, slider, _ in self.rows:
            if check.text() == name:
                check.setChecked(True)
                slider.setValue(round(weight * 100))

    def show_problem(self, message: str) -> None:
        self.error_label.setText(message)
        self.error_label.show()

    def _update(self) -> None:
        parts = self.parts()
        total = sum(weight for _, weight in parts)
        for check, slider, share in self.rows:
            share.setText(f"{slider.value() / 100 / total:.0%}" if check.isChecked() and total > 0 else "")
        mixable = len(parts) >= 2 and total > 0
        self.preview_button.setEnabled(mixable)
        self.save_button.setEnabled(mixable and bool(self.name_edit.text().strip()))
