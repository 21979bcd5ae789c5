"""TrainDeck desktop app: a PySide6 front end over the headless `core` engine."""
