"""The LSTM forecaster: one layer, 50 hidden units, dropout 0.3, a dense layer of 32, sigmoid.

Input ``[batch, W, C]`` (C = 12 features + 3 presence masks, or 1 in univariate mode); output the
logit of "an SLO breach within H steps" - ``[batch]`` for one horizon, ``[batch, outputs]`` with
one head per horizon (``outputs`` > 1: the heads share the LSTM, so several horizons cost one
forward pass; docs/forecaster.md#several-horizons). The sigmoid is applied by :meth:`risk`, so
training can use the numerically stable ``BCEWithLogitsLoss`` with a positive-class weight.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class ModelConfig:
    inputs: int
    hidden: int = 50
    layers: int = 1
    dropout: float = 0.3
    dense: int = 32
    outputs: int = 1  # one logit per horizon; artifacts written before horizons had one

    def to_dict(self) -> dict:
        return asdict(self)


class LstmForecaster(nn.Module):
    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.lstm = nn.LSTM(cfg.inputs, cfg.hidden, num_layers=cfg.layers, batch_first=True,
                            dropout=cfg.dropout if cfg.layers > 1 else 0.0)
        self.drop = nn.Dropout(cfg.dropout)
        self.dense = nn.Linear(cfg.hidden, cfg.dense)
        if cfg.outputs < 1:
            raise ValueError(f"outputs must be >= 1, got {cfg.outputs}")
        self.out = nn.Linear(cfg.dense, cfg.outputs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, (h, _) = self.lstm(x)
        z = torch.relu(self.dense(self.drop(h[-1])))
        logits = self.out(self.drop(z))
        return logits.squeeze(-1) if self.cfg.outputs == 1 else logits

    @torch.inference_mode()
    def risk(self, x: torch.Tensor) -> torch.Tensor:
        return torch.sigmoid(self.forward(x))
