"""SFT's declaration: the language-model loss over token windows (text, or chat answers); no
fields, checks or plots of its own. Its runtime: core/training/sft.py."""

from __future__ import annotations

from core.config.methods.base import WINDOWS, Method

METHOD = Method(
    name="sft",
    help="learn the data's text or answers",
    runtime="core.training.sft:SFT",
    data=WINDOWS,
)
