"""The server's settings refuse what they cannot run with, and are written once: ``aicluster
up``'s options, the server's flags and the argv between them are made from them."""

from __future__ import annotations

from pathlib import Path

import pytest
import typer

from aicluster.cli import cluster
from aicluster.cli.main import app
from aicluster.control.serveroptions import server_options, settings_from, to_argv
from aicluster.control.settings import ServerSettings
from aicluster.server import _args as server_args


def test_the_leader_lease_is_bounded() -> None:
    assert ServerSettings(lease_s=6.0).lease_s == 6.0
    assert ServerSettings().lease_s == 15.0
    for wrong in (0.5, 601.0):
        with pytest.raises(ValueError, match="lease"):
            ServerSettings(lease_s=wrong)


# Every option set away from its default (a valid value of its type).
CHANGED = {
    "db_url": "postgresql://db.example/aic",
    "host": "127.0.0.2",
    "port": 9000,
    "auth": False,
    "ray_address": "10.0.0.1:6379",
    "sandbox": False,
    "job_disk_gb": 12.5,
    "max_code_upload_bytes": 1234,
    "max_code_bytes_per_tenant": 5678,
    "max_data_bytes_per_tenant": 91011,
    "tls_cert": Path("/etc/ssl/cert.pem"),
    "tls_key": Path("/etc/ssl/key.pem"),
    "max_pending_per_tenant": 0,
    "submit_rate_per_token": "5/second",
    "submit_rate_per_tenant": "",
    "lease_s": 6.0,
    "predict_timeout_s": 5.0,
}


def test_every_option_is_changed_here() -> None:
    assert {option.name for option in server_options()} == set(CHANGED)


def test_up_starts_the_server_with_the_settings_it_was_given() -> None:
    """``up`` passes its settings as the server's flags; the server reads the same back."""
    settings = ServerSettings(state_dir=Path("/srv/state"), **CHANGED)  # type: ignore[arg-type]
    argv = ["--state-dir", "/srv/state", *to_argv(settings)]
    assert settings_from(vars(server_args(argv)), state_dir=Path("/srv/state")) == settings
    defaults = ServerSettings(state_dir=Path("/srv/state"))
    assert to_argv(defaults) == []  # the server's defaults are the same ones
    assert (
        settings_from(
            vars(server_args(["--state-dir", "/srv/state"])), state_dir=Path("/srv/state")
        )
        == defaults
    )


def test_up_has_every_server_option_with_its_default() -> None:
    command = typer.main.get_command(app)
    up = command.commands["up"]  # type: ignore[attr-defined]
    by_flag = {opt: param for param in up.params for opt in [*param.opts, *param.secondary_opts]}
    for option in server_options():
        param = by_flag[option.flag]
        lone_flag = option.negates and not option.pair
        assert param.default == (False if lone_flag else option.default), option.flag
        assert param.help == option.help
    assert by_flag["--auth"] is by_flag["--no-auth"]  # one pair


def test_the_bounds_hold_for_the_server_too() -> None:
    with pytest.raises(ValueError, match="--port must be at least 1"):
        ServerSettings(port=0)
    with pytest.raises(ValueError, match="--job-disk-gb"):
        ServerSettings(job_disk_gb=0)
    with pytest.raises(ValueError, match=r"--predict-timeout-s must be at least 0\.1"):
        ServerSettings(predict_timeout_s=0)


def test_registering_the_commands_again_keeps_ups_options_once() -> None:
    again = typer.Typer()
    cluster.register(again)
    up = typer.main.get_command(again).commands["up"]  # type: ignore[attr-defined]
    flags = [opt for param in up.params for opt in param.opts]
    assert len(flags) == len(set(flags)) and "--lease-s" in flags
