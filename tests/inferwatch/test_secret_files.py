"""Secrets from files (``<VAR>_FILE``), as containers mount them: each secret setting of the
gateway and the drift service reads the same value from a file as from its variable, and a
file that cannot serve stops the start with a message that names it."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from pydantic import ValidationError
from pydantic_settings import SettingsError

from inferwatch.drift.service.app import DriftSettings
from inferwatch.serving.settings import GatewaySettings

VALUES = {"api_keys": "key-one,key-two", "admin_token": "t0ken with spaces", "upstream_api_key": "sk-upstream",
          "drift_token": "drift-t", "redis_url": "redis://:pa55@redis:6379/2"}


def plain(settings: GatewaySettings, field: str) -> object:
    value = getattr(settings, field)
    if isinstance(value, list):
        return [v.get_secret_value() for v in value]
    return value.get_secret_value()


@pytest.fixture
def clean_env(monkeypatch):
    for var in [v for v in os.environ if v.startswith(("INFERWATCH_GATEWAY_", "INFERWATCH_DRIFT_"))]:
        monkeypatch.delenv(var)
    return monkeypatch


@pytest.mark.parametrize("field", GatewaySettings.SECRETS)
def test_each_gateway_secret_from_a_file_is_what_its_variable_gives(field, clean_env, tmp_path):
    var = f"INFERWATCH_GATEWAY_{field.upper()}"
    clean_env.setenv(var, VALUES[field])
    from_env = plain(GatewaySettings(), field)
    clean_env.delenv(var)
    (tmp_path / "secret").write_text(VALUES[field] + "\n")  # as `echo value > file` writes it
    clean_env.setenv(var + "_FILE", str(tmp_path / "secret"))
    assert plain(GatewaySettings(), field) == from_env


def test_api_keys_in_a_file_one_per_line(clean_env, tmp_path):
    (tmp_path / "keys").write_text("key-one\nkey-two\r\n\n")
    clean_env.setenv("INFERWATCH_GATEWAY_API_KEYS_FILE", str(tmp_path / "keys"))
    assert plain(GatewaySettings(), "api_keys") == ["key-one", "key-two"]


def test_a_flag_wins_over_a_file_and_the_drift_token_reads_one_too(clean_env, tmp_path):
    (tmp_path / "t").write_text("from-file")
    clean_env.setenv("INFERWATCH_GATEWAY_ADMIN_TOKEN_FILE", str(tmp_path / "t"))
    assert GatewaySettings(admin_token="from-flag").admin_token.get_secret_value() == "from-flag"
    clean_env.setenv("INFERWATCH_DRIFT_TOKEN_FILE", str(tmp_path / "t"))
    assert DriftSettings().token.get_secret_value() == "from-file"


@pytest.mark.parametrize("case, expected", [
    ("both", "INFERWATCH_GATEWAY_ADMIN_TOKEN and INFERWATCH_GATEWAY_ADMIN_TOKEN_FILE are both set"),
    ("missing", "INFERWATCH_GATEWAY_ADMIN_TOKEN_FILE: cannot read {path}: No such file or directory"),
    ("folder", "INFERWATCH_GATEWAY_ADMIN_TOKEN_FILE: cannot read {path}: Is a directory"),
    ("empty", "INFERWATCH_GATEWAY_ADMIN_TOKEN_FILE: {path} is empty"),
    ("binary", "INFERWATCH_GATEWAY_ADMIN_TOKEN_FILE: cannot read {path}: not UTF-8 text"),
])
def test_a_file_that_cannot_serve_is_refused_by_name(case, expected, clean_env, tmp_path):
    path = tmp_path / "token"
    if case == "both":
        path.write_text("x")
        clean_env.setenv("INFERWATCH_GATEWAY_ADMIN_TOKEN", "y")
    elif case == "folder":
        path.mkdir()
    elif case == "empty":
        path.write_text("\n")
    elif case == "binary":
        path.write_bytes(b"\xff\xfe\x00")
    clean_env.setenv("INFERWATCH_GATEWAY_ADMIN_TOKEN_FILE", str(path))
    with pytest.raises(SettingsError) as err:
        GatewaySettings()
    assert expected.format(path=path) in str(err.value)


def test_the_cli_exits_2_naming_the_file(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("INFERWATCH_")}
    env["INFERWATCH_DRIFT_TOKEN_FILE"] = str(tmp_path / "absent")
    done = subprocess.run([sys.executable, "-m", "inferwatch", "drift", "serve", "--port", "0"], env=env,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"INFERWATCH_DRIFT_TOKEN_FILE: cannot read {tmp_path / 'absent'}" in done.stderr
    assert "Traceback" not in done.stderr


def test_an_optional_secrets_empty_file_and_an_empty_variable_leave_it_unset(clean_env, tmp_path):
    """What compose passes where nothing is configured: the upstream key's empty placeholder
    (deploy/secrets/upstream_api_key.empty) and variables .env leaves empty."""
    (tmp_path / "empty").write_text("")
    clean_env.setenv("INFERWATCH_GATEWAY_UPSTREAM_API_KEY_FILE", str(tmp_path / "empty"))
    clean_env.setenv("INFERWATCH_GATEWAY_ADMIN_TOKEN_FILE", "")
    clean_env.setenv("INFERWATCH_GATEWAY_EXPERIMENT_FILE", "")
    settings = GatewaySettings()
    assert settings.upstream_api_key is None and settings.admin_token is None and settings.experiment_file is None
    assert GatewaySettings.OPTIONAL_SECRETS == ("upstream_api_key",)  # an empty API-key file still refuses
    clean_env.setenv("INFERWATCH_GATEWAY_API_KEYS_FILE", str(tmp_path / "empty"))
    with pytest.raises(SettingsError, match=r"INFERWATCH_GATEWAY_API_KEYS_FILE: .* is empty"):
        GatewaySettings()


def check_secrets(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "inferwatch", "check-secrets", *args], capture_output=True,
                          text=True, timeout=60)


def test_check_secrets_names_every_secret_that_cannot_serve_at_once(tmp_path):
    """The compose stack's pre-flight (`monitoring-secrets`, `serving-secrets`)."""
    (tmp_path / "good").write_text("s3cret\n")
    (tmp_path / "empty").write_text("\n")
    ok = check_secrets(f"A_FILE={tmp_path / 'good'}", "--optional", f"B_FILE={tmp_path / 'empty'}")
    assert ok.returncode == 0 and "2 secrets readable" in ok.stdout
    bad = check_secrets(f"A_FILE={tmp_path / 'empty'}", f"B_FILE={tmp_path / 'absent'}", f"C_FILE={tmp_path / 'good'}")
    assert bad.returncode == 2 and "Traceback" not in bad.stderr
    assert f"A_FILE: {tmp_path / 'empty'} is empty" in bad.stderr
    assert f"B_FILE: cannot read {tmp_path / 'absent'}: No such file or directory" in bad.stderr
    assert "C_FILE" not in bad.stderr
    malformed = check_secrets("just-a-path")
    assert malformed.returncode == 2 and "expected VAR=PATH" in malformed.stderr


@pytest.mark.parametrize("value", [",", " , ,", "\n,\n"])
def test_an_api_key_list_of_only_separators_is_refused_not_an_open_gateway(value, clean_env, tmp_path):
    clean_env.setenv("INFERWATCH_GATEWAY_API_KEYS", value)
    with pytest.raises(ValidationError, match="holds no API key"):
        GatewaySettings()
    clean_env.delenv("INFERWATCH_GATEWAY_API_KEYS")
    (tmp_path / "keys").write_text(value)
    clean_env.setenv("INFERWATCH_GATEWAY_API_KEYS_FILE", str(tmp_path / "keys"))
    with pytest.raises(SettingsError, match=r"is empty|nothing but blanks and commas"):
        GatewaySettings()
    assert check_secrets(f"GATEWAY_API_KEYS_FILE={tmp_path / 'keys'}").returncode == 2
