"""The example jobs' serving entrypoints, through the real export and loader (untrained weights)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
import torch

from aicluster.train.export import categorical_reference, export_model, load_predictor

JOBS = Path(__file__).resolve().parents[2] / "examples" / "jobs"


def example(name: str) -> ModuleType:
    spec = importlib.util.spec_from_file_location(f"example_{name}", JOBS / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def test_tiny_gpt_serves_greedy_deterministic_completions(tmp_path: Path) -> None:
    tiny_gpt = example("tiny_gpt")
    vocab = "\n abcdefghijklmnopqrstuvwxyz"
    torch.manual_seed(0)
    model = tiny_gpt.TinyGPT(len(vocab), 16, 32, 1, 2)
    config = {"vocab": vocab, "block": 16, "width": 32, "layers": 1, "heads": 2}
    path = export_model(
        model,
        entrypoint="tiny_gpt.py:load_for_serving",
        config=config,
        drift=categorical_reference("hello world", vocab, feature="prompt"),
        directory=tmp_path / "export",
        code_dir=JOBS,
    )
    predictor = load_predictor(path)
    long_prompt = "the quick brown fox jumps over the lazy dog"  # longer than the context
    first = predictor.predict({"prompt": long_prompt, "max_new_tokens": 20})
    assert len(first["completion"]) == 20 and set(first["completion"]) <= set(vocab)
    assert predictor.predict({"prompt": long_prompt, "max_new_tokens": 20}) == first
    assert len(predictor.predict({"prompt": "a"})["completion"]) == 32  # the default
    with torch.inference_mode():  # greedy: the first character is the argmax after the prompt
        ids = torch.tensor([[vocab.index(ch) for ch in long_prompt[-16:]]])
        assert first["completion"][0] == vocab[int(model(ids)[0, -1].argmax())]
    for bad, message in [
        ({"prompt": "ABC"}, "outside the vocabulary: \\['A', 'B', 'C'\\]"),
        ({"prompt": ""}, "non-empty string"),
        ({"prompt": 3}, "non-empty string"),
        ({"prompt": "a", "max_new_tokens": 257}, "from 1 to 256"),
        ({"prompt": "a", "max_new_tokens": True}, "from 1 to 256"),
    ]:
        with pytest.raises(ValueError, match=message):
            predictor.predict(bad)


def test_ddp_mlp_serves_rows_of_numbers(tmp_path: Path) -> None:
    ddp_mlp = example("ddp_mlp")
    torch.manual_seed(0)
    model = ddp_mlp.make_model(8, 16)
    path = export_model(
        model,
        entrypoint="ddp_mlp.py:load_for_serving",
        config={"features": 8, "hidden": 16},
        directory=tmp_path / "export",
        code_dir=JOBS,
    )
    predictor = load_predictor(path)
    rows = [[0.5] * 8, [-1.0] * 8]
    with torch.no_grad():
        expected = model(torch.tensor(rows)).squeeze(1).tolist()
    assert predictor.predict({"x": rows})["y"] == pytest.approx(expected)
    assert predictor.predict({"x": rows[0]})["y"] == pytest.approx(expected[:1])
    for bad in ({"x": [1.0] * 7}, {"x": "1"}, {"x": []}, {}):
        with pytest.raises(ValueError, match="8 numbers"):
            predictor.predict(bad)
