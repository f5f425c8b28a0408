"""The served MLP of the serving tests (registered by serving.register_mlp, exported by
train.py when a pipeline retrains it). Its ``config`` steers it: see serving.py."""

import os
import random
import time

import torch


class Mlp:
    def __init__(self, weights, config):
        self.config = config
        self.net = torch.nn.Sequential(
            torch.nn.Linear(config["inputs"], config["hidden"]),
            torch.nn.ReLU(),
            torch.nn.Linear(config["hidden"], config["outputs"]),
        )
        self.net.load_state_dict(weights)
        self.net.eval()
        self.random = random.Random()

    def check_health(self):
        flag = self.config.get("unhealthy_flag")
        if flag and os.path.exists(flag):
            raise RuntimeError("unhealthy: the test's flag file exists")

    def predict(self, inputs):
        x = inputs.get("x")
        size = self.config["inputs"]
        if not isinstance(x, list) or len(x) != size:
            raise ValueError(f"x must be a list of {size} numbers")
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in x):
            raise ValueError("x must hold numbers only")
        if self.config.get("delay_ms"):
            time.sleep(self.config["delay_ms"] / 1000.0)
        if self.random.random() < self.config.get("fail_rate", 0.0):
            raise RuntimeError("injected failure")
        with torch.no_grad():
            y = self.net(torch.tensor([x], dtype=torch.float32))[0]
        return {"y": [round(float(v), 6) for v in y], "tag": self.config.get("tag")}


def load(weights, config):
    return Mlp(weights, config)
