"""The smallest things the engine trains, for the tests that start it in a subprocess: a loader whose position is
its state, and a linear module whose loss is logged."""

import torch


class CountingLoader:
    """Batch i (from 1) is `batch(i)`; the state is the count, so a resumed loader continues exactly."""

    def __init__(self):
        self.i = 0

    def state_dict(self):
        return {"i": self.i}

    def load_state_dict(self, state):
        self.i = state["i"]

    def batch(self, i: int) -> dict:
        return {"x": torch.full((2, 3), float(i))}

    def __iter__(self):
        while True:
            self.i += 1
            yield self.batch(self.i)


class LinearModule(torch.nn.Module):
    def __init__(self, outputs: int = 1):
        super().__init__()
        self.lin = torch.nn.Linear(3, outputs)

    def forward(self, batch):
        loss = self.lin(batch["x"]).square().mean()
        return loss, {"loss/total": loss.detach()}
