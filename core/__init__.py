"""TrainDeck core: the headless training engine (no Qt here)."""

__version__ = "0.1.0"
