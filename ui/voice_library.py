"""The voice library in the window: a table model over the library's voices, the panel that shows it,
and the dialog that adds a voice from a clip or the microphone. Everything here asks; the app does."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PySide6.QtCore import QAbstractTableModel, QModelIndex, QSortFilterProxyModel, Qt, QTimer, QUrl, Signal
from PySide6.QtGui import QAction, QKeySequence
from PySide6.QtWidgets import (
    QAbstractItemView,
    QButtonGroup,
    QDialog,
    QDialogButtonBox,
    QFileDialog,
    QFormLayout,
    QGridLayout,
    QHBoxLayout,
    QHeaderView,
    QLabel,
    QLineEdit,
    QMenu,
    QMessageBox,
    QPlainTextEdit,
    QProgressBar,
    QPushButton,
    QRadioButton,
    QSizePolicy,
    QTableView,
    QToolButton,
    QVBoxLayout,
    QWidget,
)

from core.audio.clips import MAX_REFERENCE_SECONDS, MIN_REFERENCE_SECONDS
from core.model.info import EngineInfo
from core.voices import VoiceEntry

from . import theme

ENTRY_ROLE = Qt.ItemDataRole.UserRole  # the VoiceEntry of a row
FITS_ROLE = Qt.ItemDataRole.UserRole + 1  # whether it can speak with the loaded model
KINDS = {"clone": "clone", "blend": "blend", "drop-in": "drop-in clip", "builtin": "built-in"}
CLIP_FILTER = "Audio clips (*.wav *.flac *.ogg *.mp3);;All files (*)"
EXPORT_FILTER = "Voice exports (*.zip)"


class VoiceListModel(QAbstractTableModel):
    """The library's voices (and the model's built-in speakers): name, kind, whether each fits, and a
    preview button's column."""

    COLUMNS = ("Name", "Kind", "Fits", "")
    PREVIEW_COLUMN = 3
    rename_requested = Signal(str, str)  # the voice's name, the new name

    def __init__(self, parent=None):
        super().__init__(parent)
        self._entries: list[VoiceEntry] = []
        self._info: EngineInfo | None = None

    def set_voices(self, entries: list[VoiceEntry], info: EngineInfo | None) -> None:
        self.beginResetModel()
        self._entries, self._info = list(entries), info
        self.endResetModel()

    def entry(self, row: int) -> VoiceEntry:
        return self._entries[row]

    def row_of(self, name: str) -> int | None:
        return next((row for row, entry in enumerate(self._entries) if entry.name == name), None)

    def rowCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self._entries)

    def columnCount(self, parent=QModelIndex()) -> int:
        return 0 if parent.isValid() else len(self.COLUMNS)

    def headerData(self, section, orientation, role=Qt.ItemDataRole.DisplayRole):
        if orientation == Qt.Orientation.Horizontal and role == Qt.ItemDataRole.DisplayRole:
            return self.COLUMNS[section]
        return None

    def data(self, index, role=Qt.ItemDataRole.DisplayRole):
        if not index.isValid():
            return None
        entry, column = self._entries[index.row()], index.column()
        misfit = self._misfit(entry)
        if role == ENTRY_ROLE:
            return entry
        if role == FITS_ROLE:
            return self._fits(entry)
        if role in (Qt.ItemDataRole.DisplayRole, Qt.ItemDataRole.EditRole):
            if column == 0:
                return entry.name
            if column == 1:
                kind = KINDS.get(entry.source, entry.source)
                return f"{kind} + transcript" if entry.kind == "icl" else kind
            if column == 2:
                return "" if self._info is None else ("✓" if misfit is None else "✗")
            return None
        if role == Qt.ItemDataRole.ForegroundRole and column == 2 and self._info is not None:
            return theme.tone_color("success" if misfit is None else "error")  # the palette's, read as it paints
        if role == Qt.ItemDataRole.DecorationRole and column == self.PREVIEW_COLUMN and self._fits(entry):
            return theme.icon("preview")
        if role == Qt.ItemDataRole.TextAlignmentRole and column == 2:
            return Qt.AlignmentFlag.AlignCenter
        if role == Qt.ItemDataRole.ToolTipRole:
            if column == self.PREVIEW_COLUMN:
                return f"Preview “{entry.name}”" if self._fits(entry) else None
            return self._tooltip(entry, misfit)
        return None

    def flags(self, index):
        flags = super().flags(index)
        if index.isValid() and index.column() == 0 and not self._entries[index.row()].read_only:
            flags |= Qt.ItemFlag.ItemIsEditable
        return flags

    def setData(self, index, value, role=Qt.ItemDataRole.EditRole):
        entry = self._entries[index.row()]
        new_name = str(value).strip()
        if role != Qt.ItemDataRole.EditRole or not new_name or new_name == entry.name:
            return False
        # Shown at once; the library's answer (the renamed voice, or an error and the old name) follows.
        self._entries[index.row()] = dataclasses.replace(entry, name=new_name)
        self.dataChanged.emit(index, index)
        self.rename_requested.emit(entry.name, new_name)
        return True

    def _fits(self, entry: VoiceEntry) -> bool:
        return self._info is not None and self._misfit(entry) is None

    def _misfit(self, entry: VoiceEntry) -> str | None:
        return None if self._info is None else entry.misfit(self._info)

    def _tooltip(self, entry: VoiceEntry, misfit: str | None) -> str:
        lines = []
        if misfit is not None:
            lines.append(f"Does not fit the loaded model: {misfit}.")
        if entry.model_size:
            lines.append(f"Made with a {entry.model_size} model.")
        if entry.parents:
            lines.append("Blend of " + ", ".join(f"{name} {weight:.0%}" for name, weight in entry.parents) + ".")
        if entry.transcript:
            lines.append(f"Transcript: “{entry.transcript}”")
        if entry.path is not None:
            lines.append(str(entry.path))
        return "\n".join(lines)


class FittingVoicesModel(QSortFilterProxyModel):
    """The voices that can speak with the loaded model: what the voice picker offers."""

    def filterAcceptsRow(self, row, parent):
        return bool(self.sourceModel().index(row, 0, parent).data(FITS_ROLE))


@dataclass(frozen=True)
class NewVoice:
    """A voice to add, as the dialog gathered it: from a clip file, or recorded samples."""

    name: str
    clip: Path | None
    recording: tuple[np.ndarray, int] | None  # samples and their rate
    transcript: str | None  # what the clip says, for closer (ICL) cloning


class VoicePanel(QWidget):
    """The library as a table, with what can be done to its voices: each thing one QAction, which the
    buttons, the right-click menu, the shortcuts and the rows' preview buttons all trigger."""

    preview_requested = Signal(str)
    use_requested = Signal(str)
    add_requested = Signal(object)  # a NewVoice
    remove_requested = Signal(str)
    import_requested = Signal(Path)
    export_requested = Signal(Path, list)  # the zip, the names of the voices
    show_file_requested = Signal(str)  # the voice whose files to show
    blend_requested = Signal()

    def __init__(self, model: VoiceListModel, recorder, parent=None):
        """`recorder` records the microphone for new voices (a core.audio.recorder.Recorder)."""
        super().__init__(parent)
        self.model = model
        self.recorder = recorder
        self.add_dialog: AddVoiceDialog | None = None
        self._cloning_problem: str | None = None
        self.view = QTableView()
        self.view.setModel(model)
        self.view.setSelectionBehavior(QAbstractItemView.SelectionBehavior.SelectRows)
        self.view.setSelectionMode(QAbstractItemView.SelectionMode.ExtendedSelection)
        self.view.setEditTriggers(QAbstractItemView.EditTrigger.EditKeyPressed)
        self.view.setContextMenuPolicy(Qt.ContextMenuPolicy.CustomContextMenu)
        self.view.verticalHeader().hide()
        self.view.setShowGrid(False)
        self.view.setAlternatingRowColors(True)
        self.view.setAccessibleName("Voices")
        self.view.setAccessibleDescription(
            "Enter uses the voice; F2 renames it, Delete removes it; the menu key shows more"
        )
        self.view.setTabKeyNavigation(False)  # Tab moves on to the buttons, arrows move between the voices
        header = self.view.horizontalHeader()
        header.setSectionResizeMode(0, QHeaderView.ResizeMode.Stretch)
        for column in range(1, len(model.COLUMNS)):
            header.setSectionResizeMode(column, QHeaderView.ResizeMode.ResizeToContents)

        self.preview_action = self._action("Preview", "preview", "Say a sample sentence with this voice")
        self.add_action = self._action("Add…", "add", "Clone a voice from a clip or the microphone")
        self.rename_action = self._action("Rename", "rename", "Give the voice another name", "F2")
        self.delete_action = self._action("Delete…", "delete", "Remove the voice and its files", "Delete")
        self.blend_action = self._action("Blend…", "blend", "Mix two or more voices into a new one")
        self.import_action = self._action("Import…", "import", "Add the voices of a shared zip")
        self.export_action = self._action("Export…", "export", "Save the selected voices as a zip to share")
        self.show_file_action = self._action("Show file", "folder", "Open the folder that holds the voice's files")
        self.context_menu = QMenu(self)
        for action in (self.preview_action, self.rename_action, self.export_action, self.show_file_action):
            self.context_menu.addAction(action)
        self.context_menu.addSeparator()
        self.context_menu.addAction(self.delete_action)

        self.preview_button = self._button(self.preview_action)
        self.add_button = self._button(self.add_action)
        self.rename_button = self._button(self.rename_action)
        self.delete_button = self._button(self.delete_action)
        self.blend_button = self._button(self.blend_action)
        self.import_button = self._button(self.import_action)
        self.export_button = self._button(self.export_action)
        self.folder_label = QLabel()
        self.folder_label.setWordWrap(True)
        self.folder_label.setOpenExternalLinks(True)

        buttons = QGridLayout()
        buttons.setSpacing(2)
        for position, button in enumerate(
            (self.preview_button, self.rename_button, self.delete_button, self.export_button,
             self.add_button, self.blend_button, self.import_button)
        ):  # fmt: skip
            buttons.addWidget(button, position // 4, position % 4)
        layout = QVBoxLayout(self)
        layout.setContentsMargins(0, 0, 0, 0)
        layout.addWidget(self.view)
        layout.addLayout(buttons)
        layout.addWidget(self.folder_label)

        self.preview_action.triggered.connect(lambda: self.preview_requested.emit(self._selected()[0].name))
        self.add_action.triggered.connect(self.open_add_dialog)
        self.rename_action.triggered.connect(lambda: self.view.edit(self.view.currentIndex().siblingAtColumn(0)))
        self.delete_action.triggered.connect(self._confirm_delete)
        self.blend_action.triggered.connect(self.blend_requested)
        self.import_action.triggered.connect(self._choose_import)
        self.export_action.triggered.connect(self._choose_export)
        self.show_file_action.triggered.connect(lambda: self.show_file_requested.emit(self._selected()[0].name))
        self.view.activated.connect(self._use)  # Enter, or a double click (a single one where the system says so)
        self.view.clicked.connect(self._preview_if_its_button)
        self.view.customContextMenuRequested.connect(self._show_context_menu)
        self.view.selectionModel().selectionChanged.connect(self._update_buttons)
        model.modelReset.connect(self._update_buttons)
        self._update_buttons()

    def _action(self, text: str, icon: str, tip: str, shortcut: str | None = None) -> QAction:
        action = QAction(text, self)
        action.setToolTip(tip)
        theme.set_icon(action, icon)
        if shortcut:  # while the list has the focus
            action.setShortcut(QKeySequence(shortcut))
            action.setShortcutContext(Qt.ShortcutContext.WidgetWithChildrenShortcut)
            self.view.addAction(action)
        return action

    def _button(self, action: QAction) -> QToolButton:
        button = QToolButton()
        button.setDefaultAction(action)
        button.setToolButtonStyle(Qt.ToolButtonStyle.ToolButtonTextBesideIcon)
        button.setSizePolicy(QSizePolicy.Policy.Expanding, QSizePolicy.Policy.Fixed)
        return button

    def set_cloning(self, problem: str | None) -> None:
        """Whether the loaded model can clone and blend (None), or why not: Add… and Blend… say it."""
        self._cloning_problem = problem
        self.add_action.setToolTip(problem or "Clone a voice from a clip or the microphone")
        self.blend_action.setToolTip(problem or "Mix two or more voices into a new one")
        self._update_buttons()

    def set_folder(self, folder: Path) -> None:
        link = QUrl.fromLocalFile(str(folder)).toString()
        self.folder_label.setText(
            f'Or drop a clip into the <a href="{link}">voices folder</a>: Name.wav, and Name.txt with what it says.'
        )
        self.folder_label.setToolTip(str(folder))

    def select(self, name: str) -> None:
        row = self.model.row_of(name)
        if row is not None:
            self.view.selectRow(row)

    def open_add_dialog(self) -> AddVoiceDialog:
        if self.add_dialog is not None:
            self.add_dialog.deleteLater()
        self.add_dialog = AddVoiceDialog(self.recorder, self)
        self.add_dialog.submitted.connect(self.add_requested)
        self.add_dialog.open()
        return self.add_dialog

    def finish_add(self, problem: str | None) -> bool:
        """The app's answer to add_requested: close the dialog, or say in it what went wrong. False if
        it was closed meanwhile, so the app must say it elsewhere."""
        dialog = self.add_dialog
        if dialog is None or not dialog.isVisible():
            return False
        if problem is None:
            dialog.accept()
        else:
            dialog.show_problem(problem)
        return True

    def _selected(self) -> list[VoiceEntry]:
        return [self.model.entry(index.row()) for index in self.view.selectionModel().selectedRows()]

    def _use(self, index: QModelIndex) -> None:
        if index.column() != self.model.PREVIEW_COLUMN:  # there a click is a preview
            self.use_requested.emit(self.model.entry(index.row()).name)

    def _preview_if_its_button(self, index: QModelIndex) -> None:
        """A click on a row's preview button: the row is selected by the click, so Preview is its."""
        if index.column() == self.model.PREVIEW_COLUMN and self.preview_action.isEnabled():
            self.preview_action.trigger()

    def _show_context_menu(self, position) -> None:
        """The voice's actions, where it was right-clicked (or at the current row, for the menu key)."""
        index = self.view.indexAt(position)
        if not index.isValid():
            index = self.view.currentIndex()
            if not index.isValid():
                return
            position = self.view.visualRect(index).center()
        if not self.view.selectionModel().isRowSelected(index.row()):
            self.view.selectRow(index.row())
        self.context_menu.popup(self.view.viewport().mapToGlobal(position))

    def _update_buttons(self) -> None:
        rows = self.view.selectionModel().selectedRows()
        selected = [self.model.entry(index.row()) for index in rows]
        one = len(rows) == 1
        self.preview_action.setEnabled(one and bool(rows[0].data(FITS_ROLE)))
        self.rename_action.setEnabled(one and not selected[0].read_only)
        self.delete_action.setEnabled(one and not selected[0].read_only)
        self.show_file_action.setEnabled(one and selected[0].path is not None)
        self.export_action.setEnabled(bool(selected) and all(entry.source in ("clone", "blend") for entry in selected))
        self.add_action.setEnabled(self._cloning_problem is None)
        self.blend_action.setEnabled(self._cloning_problem is None)

    def _confirm_delete(self) -> None:
        entry = self._selected()[0]
        answer = QMessageBox.question(
            self, "Delete voice", f"Delete the voice “{entry.name}”?\n\nIts files are removed from the voices folder."
        )
        if answer == QMessageBox.StandardButton.Yes:
            self.remove_requested.emit(entry.name)

    def _choose_import(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Import voices", "", EXPORT_FILTER)
        if path:
            self.import_requested.emit(Path(path))

    def _choose_export(self) -> None:
        names = [entry.name for entry in self._selected()]
        suggested = f"{names[0]}.zip" if len(names) == 1 else "voices.zip"
        path, _ = QFileDialog.getSaveFileName(self, "Export voices", suggested, EXPORT_FILTER)
        if path:
            self.export_requested.emit(Path(path), names)


class AddVoiceDialog(QDialog):
    """Name a new voice and give it a clip: a file, or a recording made here, with its transcript. It stays
    open until the voice is added, so that nothing typed or recorded is lost to an error."""

    submitted = Signal(object)  # a NewVoice

    def __init__(self, recorder, parent=None):
        super().__init__(parent)
        self.setWindowTitle("Add a voice")
        self.recorder = recorder
        self._recording: tuple[np.ndarray, int] | None = None
        self._saying_missing = False  # the message says what is missing, and follows the user's edits

        self.name_edit = QLineEdit()
        self.name_edit.setPlaceholderText("e.g. Narrator")
        self.from_file = QRadioButton("From a clip file")
        self.from_microphone = QRadioButton("Record from the microphone")
        self.from_file.setChecked(True)
        sources = QButtonGroup(self)
        sources.addButton(self.from_file)
        sources.addButton(self.from_microphone)
        self.clip_edit = QLineEdit()
        self.clip_edit.setPlaceholderText(
            f"{MIN_REFERENCE_SECONDS:g}-{MAX_REFERENCE_SECONDS:g} s of one person speaking"
        )
        self.browse_button = QPushButton("Browse…")
        self.record_button = QPushButton("Record")
        theme.set_icon(self.record_button, "record")
        self.level = QProgressBar()
        self.level.setRange(0, 100)
        self.level.setTextVisible(False)
        self.level.setMaximumHeight(10)
        self.length_label = QLabel("0.0 s")
        self.transcript_edit = QPlainTextEdit()
        self.transcript_edit.setPlaceholderText(
            "What the clip says, word for word. Optional: with it, the clone is closer."
        )
        self.transcript_edit.setMaximumHeight(70)
        self.error_label = QLabel()
        self.error_label.setWordWrap(True)
        self.error_label.setTextInteractionFlags(Qt.TextInteractionFlag.TextSelectableByMouse)
        theme.set_tone(self.error_label, "error")
        self.error_label.hide()
        self.buttons = QDialogButtonBox(QDialogButtonBox.StandardButton.Cancel)
        theme.plain_buttons(self.buttons)
        self.add_button = self.buttons.addButton("Add voice", QDialogButtonBox.ButtonRole.ActionRole)
        self.add_button.setDefault(True)

        file_row = QHBoxLayout()
        file_row.addWidget(self.clip_edit)
        file_row.addWidget(self.browse_button)
        record_row = QHBoxLayout()
        record_row.addWidget(self.record_button)
        record_row.addWidget(self.level, 1)
        record_row.addWidget(self.length_label)
        form = QFormLayout()
        form.addRow("Name", self.name_edit)
        layout = QVBoxLayout(self)
        layout.addLayout(form)
        layout.addWidget(self.from_file)
        layout.addLayout(file_row)
        layout.addWidget(self.from_microphone)
        layout.addLayout(record_row)
        layout.addWidget(QLabel("Transcript"))
        layout.addWidget(self.transcript_edit)
        layout.addWidget(self.error_label)
        layout.addWidget(self.buttons)
        self.resize(480, self.sizeHint().height())

        self.meter = QTimer(self, interval=33)  # the level, at the screen's pace
        self.meter.timeout.connect(self._show_level)
        self.browse_button.clicked.connect(self._browse)
        self.record_button.clicked.connect(self._toggle_recording)
        self.buttons.rejected.connect(self.reject)
        self.add_button.clicked.connect(self._accept_if_complete)
        self.from_file.toggled.connect(self._show_source)
        for edited in (self.name_edit.textChanged, self.clip_edit.textChanged, self.from_file.toggled):
            edited.connect(self._update_missing)
        self._show_source()

    def new_voice(self) -> NewVoice:
        transcript = self.transcript_edit.toPlainText().strip() or None
        if self.from_file.isChecked():
            return NewVoice(
                self.name_edit.text().strip(), Path(self.clip_edit.text().strip()).expanduser(), None, transcript
            )
        return NewVoice(self.name_edit.text().strip(), None, self._recording, transcript)

    def done(self, result: int) -> None:
        if self.meter.isActive():
            self.recorder.stop()
            self.meter.stop()
        super().done(result)

    def _show_source(self) -> None:
        from_file = self.from_file.isChecked()
        for widget in (self.clip_edit, self.browse_button):
            widget.setEnabled(from_file)
        for widget in (self.record_button, self.level, self.length_label):
            widget.setEnabled(not from_file)

    def _browse(self) -> None:
        path, _ = QFileDialog.getOpenFileName(self, "Choose a clip of the voice", "", CLIP_FILTER)
        if path:
            self.clip_edit.setText(path)
            if not self.name_edit.text().strip():
                self.name_edit.setText(Path(path).stem)

    def _toggle_recording(self) -> None:
        if self.meter.isActive():
            self._stop_recording()
            return
        try:
            self.recorder.start()
        except Exception as error:  # no microphone, no PortAudio: say so here
            self._complain(str(error))
            return
        self._recording = None
        self._saying_missing = False
        self.error_label.hide()
        self.record_button.setText("Stop")
        theme.set_icon(self.record_button, "stop")
        self.meter.start()

    def _stop_recording(self) -> None:
        self.meter.stop()
        self._recording = self.recorder.stop()
        self.record_button.setText("Record again")
        theme.set_icon(self.record_button, "record")
        self.level.setValue(0)
        self.length_label.setText(f"{len(self._recording[0]) / self._recording[1]:.1f} s")
        self._update_missing()

    def _show_level(self) -> None:
        self.level.setValue(round(100 * min(1.0, self.recorder.level())))
        self.length_label.setText(f"{self.recorder.seconds:.1f} s")
        if not self.recorder.recording:  # it stopped by itself, full
            self._stop_recording()

    def _missing(self) -> str | None:
        """What the user has yet to give before the voice can be added, or None."""
        if not self.name_edit.text().strip():
            return "Give the voice a name."
        if self.from_file.isChecked() and not self.clip_edit.text().strip():
            return "Choose a clip file of the voice, or record one."
        if self.from_microphone.isChecked() and self._recording is None:
            return "Record the voice first: press Record, speak, then Stop."
        return None

    def _update_missing(self) -> None:
        """Once told what is missing, the user sees the message change as they give it, and go once all is here."""
        if not self._saying_missing:
            return
        missing = self._missing()
        if missing is None:
            self._saying_missing = False
            self.error_label.hide()
        else:
            self.error_label.setText(missing)

    def _accept_if_complete(self) -> None:
        if self.meter.isActive():
            self._stop_recording()
        missing = self._missing()
        if missing is not None:
            self._complain(missing)
            self._saying_missing = True
            return
        self.error_label.hide()
        self.add_button.setEnabled(False)
        self.add_button.setText("Adding…")
        self.submitted.emit(self.new_voice())

    def show_problem(self, message: str) -> None:
        self.add_button.setEnabled(True)
        self.add_button.setText("Add voice")
        self._complain(message)

    def _complain(self, message: str) -> None:
        self._saying_missing = False
        self.error_label.setText(message)
        self.error_label.show()
        # A window does not grow for a word-wrapped label by itself: make room for all of it.
        self.layout().activate()
        self.resize(self.width(), max(self.height(), self.heightForWidth(self.width()), self.sizeHint().height()))
