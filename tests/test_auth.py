"""Where the link key comes from: LINKESCAPE_AUTH_KEY, LINKESCAPE_AUTH_KEY_FILE,
or the per-job secret in the store."""

from __future__ import annotations

import logging

import pytest

from linkescape import auth
from linkescape.config import Config
from linkescape.errors import ConfigError


def test_key_from_the_environment_and_never_in_the_config_repr():
    cfg = Config.from_env({"LINKESCAPE_AUTH_KEY": "s3cret-s3cret-s3cret"})
    assert auth.load_key(cfg) == b"s3cret-s3cret-s3cret"
    assert "s3cret" not in repr(cfg)
    assert auth.link_key(cfg, b"store-secret", 0) == (b"s3cret-s3cret-s3cret", "key")


def test_key_file_is_read_and_stripped(tmp_path):
    path = tmp_path / "key"
    path.write_bytes(b"  the-key-in-a-file-0123456789\n")
    path.chmod(0o600)
    cfg = Config.from_env({"LINKESCAPE_AUTH_KEY_FILE": str(path)})
    assert auth.load_key(cfg) == b"the-key-in-a-file-0123456789"
    # the same key given either way authenticates the same
    assert auth.load_key(cfg) == auth.load_key(Config(auth_key="the-key-in-a-file-0123456789"))


def test_bad_key_settings_are_config_errors(tmp_path):
    with pytest.raises(ConfigError):
        Config.from_env({"LINKESCAPE_AUTH_KEY": "a", "LINKESCAPE_AUTH_KEY_FILE": "/x"})
    with pytest.raises(ConfigError):
        auth.load_key(Config(auth_key_file=str(tmp_path / "missing")))
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(ConfigError):
        auth.load_key(Config(auth_key_file=str(empty)))
    with pytest.raises(ConfigError):
        auth.load_key(Config(auth_key="   "))
    with pytest.raises(ConfigError):
        auth.link_key(Config(), None, 0)  # neither a key nor a store secret


def test_a_world_readable_key_file_and_a_short_key_are_warned_about(tmp_path, caplog):
    path = tmp_path / "key"
    path.write_text("short")
    path.chmod(0o644)
    with caplog.at_level(logging.WARNING, logger="linkescape.auth"):
        auth.link_key(Config(auth_key_file=str(path)), None, 3)
    text = " ".join(r.getMessage() for r in caplog.records)
    assert "readable by other users" in text and "5 bytes" in text


def test_without_a_key_the_store_secret_is_used_and_rank_0_says_once_what_it_protects(caplog):
    with caplog.at_level(logging.INFO, logger="linkescape.auth"):
        assert auth.link_key(Config(), b"the-store-secret", 0) == (b"the-store-secret", "store")
        auth.link_key(Config(), b"the-store-secret", 1)
    lines = [r for r in caplog.records if "cannot read the store" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING


def test_job_secrets_are_fresh_and_long():
    a, b = auth.new_job_secret(), auth.new_job_secret()
    assert a != b and len(bytes.fromhex(a)) == 32
