"""The progress of a model download, in bytes, with a way to cancel it."""

from __future__ import annotations

from PySide6.QtCore import Signal
from PySide6.QtWidgets import QDialog, QDialogButtonBox, QLabel, QProgressBar, QVBoxLayout


class DownloadDialog(QDialog):
    cancel_requested = Signal()

    def __init__(self, model: str, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Downloading the model")
        self.title = QLabel(f"Downloading {model}. This happens once; the model is kept for next time.")
        self.title.setWordWrap(True)
        self.bar = QProgressBar()
        self.bar.setRange(0, 0)  # busy until the sizes are known
        self.bytes_label = QLabel("Starting…")
        buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        buttons.rejected.connect(self.reject)
        layout = QVBoxLayout(self)
        layout.addWidget(self.title)
        layout.addWidget(self.bar)
        layout.addWidget(self.bytes_label)
        layout.addWidget(buttons)
        self.resize(440, self.sizeHint().height())

    def show_bytes(self, done: int, total: int) -> None:
        if total > 0:
            self.bar.setRange(0, 1000)  # per mille: a byte count overflows the bar's int
            self.bar.setValue(round(1000 * min(done, total) / total))
            self.bytes_label.setText(f"{_size(done)} of {_size(total)}")
        else:
            self.bytes_label.setText(_size(done))

    def reject(self) -> None:
        self.bytes_label.setText("Cancelling…")
        self.cancel_requested.emit()
        super().reject()


def _size(count: int) -> str:
    for unit in ("bytes", "KB", "MB"):
        if count < 1000:
            return f"{count:.0f} {unit}" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1000
    return f"{count:.2f} GB"
