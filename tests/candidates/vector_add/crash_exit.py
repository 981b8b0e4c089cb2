"""Ends the process from its forward pass with os._exit(0) (no traceback, no result): the
candidate's own failure, never "could not run". Expect dry-run:crash."""
import os

import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, x, y):
        os._exit(0)
