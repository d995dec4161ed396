"""The demo's model and data: an MLP and a synthetic, seeded classification task.

Imported by the training script (in every rank) and by the controller (for
the option choices); it imports torch only inside its functions.
"""

from __future__ import annotations

import hashlib
from typing import Dict, List, Tuple

#: (input features, hidden width, hidden layers, classes, batch per rank)
MODEL_SIZES: Dict[str, Tuple[int, int, int, int, int]] = {
    "tiny": (32, 64, 2, 8, 16),        # unit tests: a few thousand parameters
    "small": (128, 512, 2, 10, 32),    # quick runs: ~0.3 M parameters, 1.3 MB of gradients
    "medium": (256, 1024, 3, 16, 64),  # the demo: ~2.4 M parameters, 9.5 MB of gradients per step
    "large": (512, 1536, 3, 16, 64),   # ~5.5 M parameters
}
DEFAULT_SIZE = "medium"


def build_model(size: str, seed: int):
    import torch

    d_in, width, layers, classes, _ = MODEL_SIZES[size]
    torch.manual_seed(seed)
    mods: List[torch.nn.Module] = []
    prev = d_in
    for _ in range(layers):
        mods += [torch.nn.Linear(prev, width), torch.nn.ReLU()]
        prev = width
    mods.append(torch.nn.Linear(prev, classes))
    return torch.nn.Sequential(*mods)


class SyntheticData:
    """Gaussian inputs labelled by a fixed random teacher network; one stream per rank."""

    def __init__(self, size: str, seed: int, rank: int) -> None:
        import torch

        d_in, _, _, classes, batch = MODEL_SIZES[size]
        g = torch.Generator().manual_seed(seed * 1_000_003 + 7)  # the same teacher on every rank
        self.w1 = torch.randn(d_in, 64, generator=g) / d_in ** 0.5
        self.w2 = torch.randn(64, classes, generator=g) / 8.0
        self.gen = torch.Generator().manual_seed(seed * 1_000_003 + 101 + rank)
        self.d_in = d_in
        self.batch = batch

    def next(self):
        import torch

        x = torch.randn(self.batch, self.d_in, generator=self.gen)
        y = (torch.tanh(x @ self.w1) @ self.w2).argmax(dim=1)
        return x, y


def param_digest(model) -> Tuple[str, Dict[str, "object"]]:
    """SHA-256 over every parameter's name, shape, dtype and bytes (state_dict order)."""
    h = hashlib.sha256()
    arrays = {}
    for name, t in model.state_dict().items():
        a = t.detach().cpu().contiguous().numpy()
        h.update(f"{name}|{a.dtype.str}|{a.shape}|".encode())
        h.update(a.tobytes())
        arrays[name] = a
    return h.hexdigest(), arrays
