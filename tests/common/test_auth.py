"""Where the link key comes from: LINKESCAPE_AUTH_KEY, LINKESCAPE_AUTH_KEY_FILE,
or the per-job secret in the store; what is refused (an empty key, a key file
others can read or change, no key with LINKESCAPE_AUTH=required); and the
FileStore that holds the per-job secret."""

from __future__ import annotations

import logging
import os
import stat

import pytest

from linkescape import Communicator, FileStore, auth
from linkescape.config import Config
from linkescape.errors import ConfigError


def _key_file(tmp_path, text, mode=0o600, name="key"):
    path = tmp_path / name
    path.write_bytes(text if isinstance(text, bytes) else text.encode())
    path.chmod(mode)
    return path


def test_key_from_the_environment_and_never_in_the_config_repr():
    cfg = Config.from_env({"LINKESCAPE_AUTH_KEY": "s3cret-s3cret-s3cret"})
    assert auth.load_key(cfg) == b"s3cret-s3cret-s3cret"
    assert "s3cret" not in repr(cfg)
    assert auth.link_key(cfg, b"store-secret", 0) == (b"s3cret-s3cret-s3cret", "key")


def test_key_file_is_read_and_stripped(tmp_path):
    path = _key_file(tmp_path, b"  the-key-in-a-file-0123456789\n")
    cfg = Config.from_env({"LINKESCAPE_AUTH_KEY_FILE": str(path)})
    assert auth.load_key(cfg) == b"the-key-in-a-file-0123456789"
    # the same key given either way authenticates the same
    assert auth.load_key(cfg) == auth.load_key(Config(auth_key="the-key-in-a-file-0123456789"))


def test_both_sources_are_stripped_the_same_way(tmp_path):
    """``LINKESCAPE_AUTH_KEY="$(cat file)"`` and ``LINKESCAPE_AUTH_KEY_FILE=file``
    give the same key, whatever whitespace surrounds it."""
    for raw in (" k3y-with-spaces-around-0123456789 \n", "\tk3y-with-spaces-around-0123456789\r\n"):
        from_env = auth.load_key(Config.from_env({"LINKESCAPE_AUTH_KEY": raw}))
        from_file = auth.load_key(Config(auth_key_file=str(_key_file(tmp_path, raw))))
        assert from_env == from_file == b"k3y-with-spaces-around-0123456789"


@pytest.mark.parametrize("var,value", [("LINKESCAPE_AUTH_KEY", ""), ("LINKESCAPE_AUTH_KEY", "  \n"),
                                       ("LINKESCAPE_AUTH_KEY_FILE", "")])
def test_an_empty_key_variable_is_a_config_error_never_no_key(var, value):
    # e.g. LINKESCAPE_AUTH_KEY=$(cat missing): set, but empty. Unset is the only "no key".
    with pytest.raises(ConfigError):
        Config.from_env({var: value})
    assert Config.from_env({}).auth_key is None and auth.load_key(Config.from_env({})) is None


def test_an_empty_key_variable_stops_a_communicator_before_any_link(tmp_path, monkeypatch):
    monkeypatch.setenv("LINKESCAPE_AUTH_KEY", "")
    monkeypatch.setenv("LINKESCAPE_CONNECT_TIMEOUT", "1")  # were it to try, it would give up soon
    with pytest.raises(ConfigError):
        Communicator(FileStore(str(tmp_path / "store"), timeout=1), 0, 2, rails=["127.0.0.1"])


def test_bad_key_settings_are_config_errors(tmp_path):
    with pytest.raises(ConfigError):
        Config.from_env({"LINKESCAPE_AUTH_KEY": "a", "LINKESCAPE_AUTH_KEY_FILE": "/x"})
    with pytest.raises(ConfigError):  # an empty key beside a file is still both set
        Config.from_env({"LINKESCAPE_AUTH_KEY": "", "LINKESCAPE_AUTH_KEY_FILE": "/x"})
    with pytest.raises(ConfigError):
        auth.load_key(Config(auth_key_file=str(tmp_path / "missing")))
    for blank in (b"", b"\n", b" \t \n"):
        with pytest.raises(ConfigError):
            auth.load_key(Config(auth_key_file=str(_key_file(tmp_path, blank, name="blank"))))
    with pytest.raises(ConfigError):
        Config(auth_key="   ")
    with pytest.raises(ConfigError):
        auth.link_key(Config(), None, 0)  # neither a key nor a store secret


def test_auth_required_refuses_to_start_without_a_key(tmp_path, monkeypatch):
    with pytest.raises(ConfigError):
        Config.from_env({"LINKESCAPE_AUTH": "required"})
    with pytest.raises(ConfigError):
        Config.from_env({"LINKESCAPE_AUTH": "sometimes", "LINKESCAPE_AUTH_KEY": "k" * 32})
    # with a key it starts, and the key is used
    cfg = Config.from_env({"LINKESCAPE_AUTH": "required", "LINKESCAPE_AUTH_KEY": "k" * 32})
    assert cfg.auth == "required" and auth.link_key(cfg, b"store-secret", 0) == (b"k" * 32, "key")
    path = _key_file(tmp_path, "k" * 32)
    cfg = Config.from_env({"LINKESCAPE_AUTH": "REQUIRED", "LINKESCAPE_AUTH_KEY_FILE": str(path)})
    assert auth.link_key(cfg, None, 0) == (b"k" * 32, "key")
    # optional (the default, or said) falls back to the store's per-job secret
    assert Config.from_env({"LINKESCAPE_AUTH": "optional"}).auth == Config().auth == "optional"
    assert auth.link_key(Config.from_env({"LINKESCAPE_AUTH": "optional"}), b"s" * 16, 1) == (b"s" * 16, "store")
    # and a communicator refuses to start, before touching the store or a socket
    monkeypatch.setenv("LINKESCAPE_AUTH", "required")
    monkeypatch.delenv("LINKESCAPE_AUTH_KEY", raising=False)
    monkeypatch.delenv("LINKESCAPE_AUTH_KEY_FILE", raising=False)
    monkeypatch.setenv("LINKESCAPE_CONNECT_TIMEOUT", "1")  # were it to try, it would give up soon
    with pytest.raises(ConfigError):
        Communicator(FileStore(str(tmp_path / "store"), timeout=1), 1, 2, rails=["127.0.0.1"])


@pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o620, 0o602, 0o660], ids=oct)
def test_a_key_file_open_to_group_or_others_is_refused(tmp_path, mode):
    path = _key_file(tmp_path, "a-key-of-at-least-16-bytes", mode)
    with pytest.raises(ConfigError):
        auth.load_key(Config(auth_key_file=str(path)))
    path.chmod(0o600)  # the fix the message names
    assert auth.load_key(Config(auth_key_file=str(path))) == b"a-key-of-at-least-16-bytes"
    path.chmod(0o400)
    assert auth.load_key(Config(auth_key_file=str(path))) == b"a-key-of-at-least-16-bytes"


def test_a_key_file_of_another_user_is_refused(tmp_path):
    if os.geteuid() == 0:
        path = _key_file(tmp_path, "a-key-of-at-least-16-bytes")
        os.chown(path, 65534, 65534)  # nobody's, 0600
    else:  # a file another user (root) owns and that we can read
        path = "/etc/passwd"
        assert os.stat(path).st_uid != os.geteuid()
    with pytest.raises(ConfigError):
        auth.load_key(Config(auth_key_file=str(path)))


def test_a_key_file_that_is_not_a_file_is_refused(tmp_path):
    (tmp_path / "dir").mkdir(mode=0o700)
    with pytest.raises(ConfigError):
        auth.load_key(Config(auth_key_file=str(tmp_path / "dir")))


def test_a_short_key_is_warned_about(tmp_path, caplog):
    path = _key_file(tmp_path, "short")
    with caplog.at_level(logging.WARNING, logger="linkescape.auth"):
        auth.link_key(Config(auth_key_file=str(path)), None, 3)
    assert any("5 bytes" in r.getMessage() for r in caplog.records)


def test_without_a_key_the_store_secret_is_used_and_rank_0_says_once_what_it_protects(caplog):
    with caplog.at_level(logging.INFO, logger="linkescape.auth"):
        assert auth.link_key(Config(), b"the-store-secret", 0) == (b"the-store-secret", "store")
        auth.link_key(Config(), b"the-store-secret", 1)
    lines = [r for r in caplog.records if "cannot read the store" in r.getMessage()]
    assert len(lines) == 1 and lines[0].levelno == logging.WARNING


def test_job_secrets_are_fresh_and_long():
    a, b = auth.new_job_secret(), auth.new_job_secret()
    assert a != b and len(bytes.fromhex(a)) == 32


def test_file_store_writes_0600_files_in_a_0700_directory(tmp_path):
    old = os.umask(0o022)  # the usual umask: 0644 files, 0755 directories by default
    try:
        store = FileStore(str(tmp_path / "parent" / "store"))
        store.set("linkescape/secret/job", "the per-job secret")
        store.set("linkescape/job", b"job")
        store.set("linkescape/job", b"job, again")  # replacing keeps the mode
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(store.path).st_mode) == 0o700
    names = os.listdir(store.path)
    assert len(names) == 2 and not any(n.endswith(".tmp") for n in names)  # no temporary file left
    for name in names:
        assert stat.S_IMODE(os.stat(os.path.join(store.path, name)).st_mode) == 0o600
    assert store.get("linkescape/secret/job") == b"the per-job secret"
    assert store.get("linkescape/job") == b"job, again"
    # a directory that exists already (made by the launcher, or another rank) is left as it is
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o750)
    FileStore(str(shared)).set("k", "v")
    assert stat.S_IMODE(os.stat(shared).st_mode) == 0o750
