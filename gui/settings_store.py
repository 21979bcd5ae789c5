"""What the window remembers between launches: geometry, splitters, preset, form, plot options."""

from __future__ import annotations

import json

from PySide6.QtCore import QSettings

from core.config.spec import TrainConfig, from_dict, validate
from core.errors import UserError


def as_bool(value) -> bool:
    # QSettings' INI backend hands booleans back as the strings "true"/"false".
    return value is True or str(value).lower() == "true"


class SettingsStore:
    """Reads and writes a MainWindow's state in QSettings."""

    def __init__(self, settings: QSettings | None = None):
        self.settings = settings if settings is not None else QSettings("TrainDeck", "TrainDeck")

    def save(self, window) -> None:
        s = self.settings
        s.setValue("window/geometry", window.saveGeometry())
        s.setValue("window/splitter", window.splitter.saveState())
        s.setValue("window/lower_splitter", window.run_view.lower_splitter.saveState())
        s.setValue("preset", window.preset_box.current())
        s.setValue("config", json.dumps(window.form.config().to_dict()))
        plots = window.plots
        s.setValue("plots/smooth", plots.smooth.isChecked())
        s.setValue("plots/smooth_window", plots.smooth_window.value())
        s.setValue("plots/log", plots.log_scale.isChecked())
        s.sync()

    def restore(self, window) -> None:
        s = self.settings
        for key, widget in (
            ("window/splitter", window.splitter),
            ("window/lower_splitter", window.run_view.lower_splitter),
        ):
            if s.value(key):
                widget.restoreState(s.value(key))
        if s.value("window/geometry"):
            window.restoreGeometry(s.value("window/geometry"))
        plots = window.plots
        plots.smooth.setChecked(as_bool(s.value("plots/smooth", False)))
        plots.smooth_window.setValue(int(s.value("plots/smooth_window", 25)))
        plots.log_scale.setChecked(as_bool(s.value("plots/log", False)))
        # The last-used preset, else the recommended one (a saved user preset may be gone).
        box = window.preset_box
        names = [s.value("preset"), box.recommended] + [p.name for p in box.presets[:1]]
        next((n for n in names if n and box.select(n)), None)
        saved = self.saved_config()
        if saved is not None:
            window.form.set_config(saved)

    def saved_config(self) -> TrainConfig | None:
        """The last-used settings, or None if missing or no longer valid for core."""
        text = self.settings.value("config")
        if not text:
            return None
        try:
            return validate(from_dict(json.loads(text), source="saved settings"))
        except (UserError, ValueError, TypeError):
            return None
