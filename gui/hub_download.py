"""A hub model downloaded off the GUI thread, with a progress dialog and Cancel; what was
fetched stays in the Hugging Face cache (core.weights.download)."""

from __future__ import annotations

from PySide6.QtCore import Qt, QThread, Signal
from PySide6.QtWidgets import QProgressDialog, QWidget

from core.errors import UserError
from core.weights import download
from core.weights.loader import config_only

STEPS = 1000  # the dialog's range: thousandths of the download


class DownloadThread(QThread):
    described = Signal(str)  # what config.json says, before any weights come
    configured = Signal(object)  # the model as its config.json alone (loader.config_only)
    progressed = Signal(float, float)  # bytes done, bytes in all (floats: past 2 GiB)
    done = Signal(str)  # the snapshot folder
    failed = Signal(str)  # one line

    def __init__(self, repo_id: str, parent=None):
        super().__init__(parent)
        self.repo_id = repo_id
        self.cancelled = False

    def run(self) -> None:
        try:
            pre = config_only(self.repo_id)  # config.json alone: a few kB
            self.described.emit(f"{pre.family}, {pre.n_params() / 1e6:,.1f}M parameters")
            self.configured.emit(pre)
            folder = download.download(
                self.repo_id,
                progress=lambda done, total: self.progressed.emit(float(done), float(total)),
                cancel=lambda: self.cancelled,
            )
        except UserError as e:
            self.failed.emit(str(e))
            return
        except Exception as e:  # a bug or an unforeseen failure: still one line in the box
            self.failed.emit(f"init_from: downloading {self.repo_id} failed ({e!r})"[:300])
            return
        self.done.emit(str(folder))


class HubDownload:
    """One download with its dialog: Cancel asks the thread to stop between chunks."""

    def __init__(self, repo_id: str, parent: QWidget):
        self.thread = DownloadThread(repo_id, parent)
        self.dialog = QProgressDialog(f"Downloading {repo_id}…", "Cancel", 0, STEPS, parent)
        self.dialog.setWindowTitle("Download")
        self.dialog.setWindowModality(Qt.WindowModality.NonModal)
        self.dialog.setMinimumDuration(0)
        self.dialog.setAutoClose(False)
        self.dialog.setAutoReset(False)
        self.dialog.canceled.connect(self.cancel)
        self.thread.progressed.connect(self._progressed)
        self.thread.finished.connect(self.dialog.close)

    def start(self) -> None:
        self.dialog.setValue(0)
        self.dialog.show()
        self.thread.start()

    def cancel(self) -> None:
        self.thread.cancelled = True

    def _progressed(self, done: float, total: float) -> None:
        self.dialog.setValue(int(STEPS * done / total) if total else 0)
        self.dialog.setLabelText(
            f"Downloading {self.thread.repo_id}: {done / 1e9:,.2f} of {total / 1e9:,.2f} GB"
        )
