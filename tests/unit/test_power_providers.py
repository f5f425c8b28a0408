"""The script provider's file (runtime/cluster/providers.py): the shipped examples load, and a bad
file is refused with a message naming what is wrong."""

from pathlib import Path

import pytest

from aicluster.runtime.cluster.providers import load_provider

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("name", ["ipmi.yaml", "redfish.yaml"])
def test_the_examples_load(name: str) -> None:
    provider = load_provider(ROOT / "examples" / "power" / name)
    assert set(provider.commands) == {"suspend", "resume"}
    assert provider.never_suspend == frozenset({"node-00"})
    script = Path(provider.commands["resume"][0].replace("/opt/aicluster", str(ROOT)))
    assert script.is_file() and script.stat().st_mode & 0o111  # shipped, executable


@pytest.mark.parametrize(
    ("text", "says"),
    [
        ("kind: cloud\n", "starts with 'kind: script'"),
        ("kind: script\nsuspend: [a]\n", "needs a suspend and a resume"),
        ("kind: script\nsuspend: [a]\nresume: [b]\nresum: [c]\n", "unknown keys resum"),
        ("kind: script\nsuspend: [a, 1]\nresume: [b]\n", "suspend is a command"),
        ("kind: script\nsuspend: a\nresume: b\ntimeout_s: 0\n", "timeout_s is a positive"),
        ("kind: script\nsuspend: a\nresume: b\nnever_suspend: n0\n", "never_suspend is a list"),
    ],
)
def test_a_bad_file_says_what_is_wrong(tmp_path: Path, text: str, says: str) -> None:
    path = tmp_path / "provider.yaml"
    path.write_text(text)
    with pytest.raises(ValueError, match=says):
        load_provider(path)


def test_a_command_may_be_one_string(tmp_path: Path) -> None:
    path = tmp_path / "provider.yaml"
    path.write_text("kind: script\nsuspend: /bin/off\nresume: /bin/on\n")
    provider = load_provider(path)
    assert provider.commands == {"suspend": ["/bin/off"], "resume": ["/bin/on"]}
    assert provider.timeout_s == 600.0


def test_up_refuses_a_provider_file_it_cannot_use_before_starting_anything(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from aicluster.cli.main import app

    bad = tmp_path / "provider.yaml"
    bad.write_text("kind: script\nsuspend: [a]\n")
    home = ["--home", str(tmp_path / "home")]
    cli = CliRunner()
    embedded = cli.invoke(app, ["up", "--power-provider", str(bad), *home])
    assert embedded.exit_code != 0
    assert "--power-provider goes with --ray-address" in embedded.output
    joined = ["--ray-address", "10.0.0.1:6379", "--power-provider", str(bad), *home]
    refused = cli.invoke(app, ["up", *joined])
    assert refused.exit_code != 0 and "needs a suspend and a resume" in refused.output
    assert not (tmp_path / "home" / "server.json").exists()
