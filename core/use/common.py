"""What every export shares: its error, the optional packages it needs, and the weights under
TrainDeck's and the family's Hugging Face names."""

from __future__ import annotations

import torch

from core.errors import UserError
from core.weights import families
from core.weights.loader import Loaded


class ExportError(UserError):
    pass


def need(module: str):
    try:
        return __import__(module, fromlist=["_"])
    except ImportError:
        raise ExportError(
            f"export: this format needs the '{module}' package, a base dependency that is "
            "missing: run the launcher again, or pip install -e ."
        ) from None


def weights(model) -> dict[str, torch.Tensor]:
    return {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}


def hf_state_dict(loaded: Loaded) -> dict[str, torch.Tensor]:
    """The weights under the model family's Hugging Face names."""
    return families.export_weights(loaded.family, loaded.model.config, loaded.model.state_dict())
