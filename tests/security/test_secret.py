"""The federation secret file, weak-secret refusal, key derivation, private files, identities."""

from __future__ import annotations

import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile
import tomllib
from pathlib import Path

import pytest

from common.config import FederationConfig
from common.errors import ConfigError, ValidationError
from security import files
from security.identity import OPERATOR, Identity, Role, gm, lm, user, workers
from security.secret import (
    SECRET_FILE_ENV,
    Secret,
    check_secret,
    create_secret_file,
    ensure_secret_file,
    hkdf_sha256,
    known_weak_secrets,
    load_secret,
)

REPO = Path(__file__).resolve().parents[2]
STRONG = "9f1c2b7a4e8d3f60a5b1c9e7d2f4a8b3"


def mode(path: Path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


# ----------------------------------------------------------- identities
def test_identity_round_trips_and_refuses_bad_names() -> None:
    assert str(gm("gm0")) == "gm:gm0"
    assert Identity.parse("workers:lm3") == workers("lm3")
    assert Identity.parse(str(OPERATOR)) == OPERATOR
    for bad in ("gm", "gm:", "boss:x", "gm:a.b", "user:a b", "lm:" + "x" * 65, "gm:-x", "user:é"):
        with pytest.raises(ValidationError) as exc:
            Identity.parse(bad)
        assert exc.value.reason == "bad_identity"


# ------------------------------------------------------------ the file
def test_created_secret_is_random_private_and_never_overwritten(tmp_path: Path) -> None:
    home = tmp_path / "home"
    path = create_secret_file(home)
    assert path == home / "secret"
    assert mode(path) == 0o600
    assert mode(home) == 0o700
    text = path.read_text().strip()
    assert re.fullmatch(r"[0-9a-f]{64}", text), text  # 256 bits, as hex
    # drawn at random: not mostly zeros, nor a few digits repeated (each p < 2**-50)
    assert int(text, 16).bit_length() > 200
    assert len(set(text)) >= 8
    assert load_secret(path).value == text.encode()
    with pytest.raises(ConfigError) as exc:
        create_secret_file(home)
    assert exc.value.reason == "secret_exists"
    assert path.read_text().strip() == text
    other = create_secret_file(tmp_path / "other")
    assert other.read_text() != path.read_text()
    assert [p.name for p in home.iterdir()] == ["secret"]  # no temp file left behind


def test_secret_file_is_private_even_under_a_lax_umask(tmp_path: Path) -> None:
    old = os.umask(0)
    try:
        path = create_secret_file(tmp_path / "h")
    finally:
        os.umask(old)
    assert mode(path) == 0o600


def test_ensure_reuses_a_private_secret_and_refuses_an_exposed_one(tmp_path: Path) -> None:
    first = ensure_secret_file(tmp_path)
    assert ensure_secret_file(tmp_path).value == first.value
    for lax in (0o644, 0o640, 0o604, 0o660):
        os.chmod(tmp_path / "secret", lax)
        with pytest.raises(ConfigError) as exc:
            ensure_secret_file(tmp_path)
        assert exc.value.reason == "file_not_private"
    os.chmod(tmp_path / "secret", 0o600)
    assert ensure_secret_file(tmp_path).value == first.value


def test_a_symlinked_secret_is_refused(tmp_path: Path) -> None:
    real = create_secret_file(tmp_path / "real")
    link = tmp_path / "link"
    link.symlink_to(real)
    with pytest.raises(ConfigError) as exc:
        load_secret(link)
    assert exc.value.reason == "file_not_regular"


def test_a_secret_owned_by_someone_else_is_refused(tmp_path: Path) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root to chown")
    path = create_secret_file(tmp_path)
    os.chown(path, 65534, 65534)
    with pytest.raises(ConfigError) as exc:
        load_secret(path)
    assert exc.value.reason == "file_wrong_owner"


def test_services_find_the_file_through_the_environment(tmp_path: Path) -> None:
    path = create_secret_file(tmp_path)
    assert load_secret(environ={SECRET_FILE_ENV: str(path)}).source == str(path)
    with pytest.raises(ConfigError) as exc:
        load_secret(environ={})
    assert exc.value.reason == "no_secret"
    with pytest.raises(ConfigError) as exc:
        load_secret(tmp_path / "absent")
    assert exc.value.reason == "file_missing"


# ------------------------------------------------------- weak secrets
def test_the_default_and_example_secrets_are_known_weak() -> None:
    """The example leaves the secret unset (``megha up`` makes a random one); one it ever
    set, or sets again, is weak."""
    example = tomllib.loads((REPO / "config" / "federation.example.toml").read_text())
    assert example["federation"].get("secret") in (None, *known_weak_secrets())
    assert "change-me-before-sharing-this-machine" in known_weak_secrets()
    assert FederationConfig().secret in known_weak_secrets()


@pytest.mark.parametrize(
    "weak",
    [
        "",
        "megha-dev-secret-change-me",
        "change-me-before-sharing-this-machine",
        "short-secret",
        "a" * 40,
        "abababababababababababababababab",
    ],
)
def test_weak_secrets_are_refused_unless_insecure_dev(weak: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        check_secret(weak)
    assert exc.value.reason == "weak_secret"
    warning = check_secret(weak, insecure_dev=True)
    assert warning is not None
    assert "insecure-dev" in warning
    path = tmp_path / "secret"
    files.create_private(path, weak.encode())
    with pytest.raises(ConfigError):
        load_secret(path)
    assert load_secret(path, insecure_dev=True).warning == warning


def test_a_strong_secret_passes_without_warning() -> None:
    assert check_secret(STRONG) is None
    assert Secret.from_text(STRONG, "test").warning is None


def test_secret_value_is_not_in_its_repr() -> None:
    assert STRONG not in repr(Secret.from_text(STRONG, "test"))


# ------------------------------------------------------ key derivation
def test_hkdf_matches_rfc5869_test_case_1() -> None:
    ikm = bytes.fromhex("0b" * 22)
    salt = bytes.fromhex("000102030405060708090a0b0c")
    info = bytes.fromhex("f0f1f2f3f4f5f6f7f8f9")
    okm = hkdf_sha256(ikm, salt, info, 42)
    assert okm.hex() == (
        "3cb25f25faacd57a90434f64d0362f2a2d2d0a90cf1a5a4c5db02d56ecc4c5bf34007208d5b887185865"
    )


def test_hkdf_matches_rfc5869_test_case_3_empty_salt_and_info() -> None:
    okm = hkdf_sha256(bytes.fromhex("0b" * 22), b"", b"", 42)
    assert okm.hex() == (
        "8da4e775a563c18f715f802a063c5a31b8a11f5c5ee1879ec3454e5f3c738d2d9d201395faa4b61a96c8"
    )


def test_keys_differ_per_identity_purpose_and_direction() -> None:
    s = Secret.from_text(STRONG, "test")
    keys = [
        s.identity_key(lm("lm0"), "amqp"),
        s.identity_key(lm("lm1"), "amqp"),
        s.identity_key(workers("lm0"), "amqp"),
        s.identity_key(lm("lm0"), "http"),
        s.channel_key(workers("lm0"), lm("lm0"), "http"),
        s.channel_key(lm("lm0"), workers("lm0"), "http"),
        s.channel_key(gm("gm0"), lm("lm0"), "http"),
        s.channel_key(user("u"), lm("lm0"), "http"),
    ]
    assert len(set(keys)) == len(keys)
    assert all(len(k) == 32 for k in keys)
    assert s.identity_key(lm("lm0"), "amqp") == Secret.from_text(STRONG, "x").identity_key(
        Identity(Role.LM, "lm0"), "amqp"
    )
    other = Secret.from_text(STRONG[::-1], "test")
    assert other.identity_key(lm("lm0"), "amqp") != keys[0]
    with pytest.raises(ValueError, match="purpose"):
        s.identity_key(lm("lm0"), "Bad Purpose")


# ------------------------------------------------------- private files
def test_write_private_replaces_atomically_and_keeps_mode(tmp_path: Path) -> None:
    path = tmp_path / "f"
    files.write_private(path, b"one")
    inode = os.stat(path).st_ino
    files.write_private(path, b"two")
    assert path.read_bytes() == b"two"
    assert mode(path) == 0o600
    assert os.stat(path).st_ino != inode  # a new file renamed over the old one
    assert sorted(p.name for p in tmp_path.iterdir()) == ["f"]
    assert files.read_private(path) == b"two"


# ------------------------------------------------- orchestrator mounts
POD_UID, POD_GID = 10001, 10001


def stat_of(mode: int, uid: int, gid: int) -> os.stat_result:
    """What ``fstat`` says of a file of ``mode`` owned by ``uid:gid``."""
    return os.stat_result((mode, 1, 1, 1, uid, gid, 64, 0, 0, 0))


REG = stat.S_IFREG


@pytest.mark.parametrize(
    ("mode", "uid", "gid"),
    [
        (REG | 0o400, 0, 0),  # a Kubernetes secret volume, defaultMode 0400, no fsGroup
        (REG | 0o440, 0, POD_GID),  # defaultMode 0400 with fsGroup: group read is added
        (REG | 0o400, POD_UID, POD_GID),  # mounted as the process's own
        (REG | 0o440, POD_UID, POD_GID),
    ],
)
def test_a_read_only_mounted_secret_is_accepted(mode: int, uid: int, gid: int) -> None:
    files.check_mounted(
        stat_of(mode, uid, gid),
        Path("/etc/megha/secret/secret"),
        read_only_mount=True,
        euid=POD_UID,
        groups={POD_GID},
    )


@pytest.mark.parametrize(
    ("mode", "uid", "gid", "read_only", "reason"),
    [
        (REG | 0o400, 0, 0, False, "file_not_mounted"),  # e.g. a file in $HOME, chowned root
        (REG | 0o400, 65534, 0, True, "file_wrong_owner"),  # another user's file
        (REG | 0o600, 0, 0, True, "file_writable"),  # writable by its owner
        (REG | 0o460, 0, POD_GID, True, "file_writable"),  # group-writable
        (REG | 0o402, 0, 0, True, "file_writable"),  # world-writable
        (REG | 0o444, 0, 0, True, "file_not_private"),  # defaultMode 0444: anyone reads it
        (REG | 0o404, POD_UID, POD_GID, True, "file_not_private"),
        (REG | 0o440, 0, 65534, True, "file_not_private"),  # a group the process is not in
        (REG | 0o500, 0, 0, True, "file_not_private"),  # executable: not a secret volume's
        (stat.S_IFDIR | 0o500, 0, 0, True, "file_not_regular"),
    ],
)
def test_a_mounted_secret_others_could_read_or_change_is_refused(
    mode: int, uid: int, gid: int, read_only: bool, reason: str
) -> None:
    with pytest.raises(ConfigError) as exc:
        files.check_mounted(
            stat_of(mode, uid, gid),
            Path("/etc/megha/secret/secret"),
            read_only_mount=read_only,
            euid=POD_UID,
            groups={POD_GID},
        )
    assert exc.value.reason == reason


def secret_volume(root: Path, text: str, mode: int = 0o440) -> Path:
    """A directory laid out as the kubelet lays out a secret volume: the file behind
    ``..data`` symlinks, root-owned (this test runs as root), ``mode``."""
    version = root / "..2026_11_23_14_00_00.000000001"
    version.mkdir(parents=True)
    (version / "secret").write_text(text + "\n")
    os.chmod(version / "secret", mode)
    (root / "..data").symlink_to(version.name)
    (root / "secret").symlink_to("..data/secret")
    return root / "secret"


def test_load_secret_accepts_a_secret_volume_only_when_told_it_is_mounted(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: the kubelet's files belong to root")
    path = secret_volume(tmp_path / "vol", STRONG)
    env = {SECRET_FILE_ENV: str(path), files.MOUNTED_ENV: "1"}
    # Not on a read-only mount (tmp_path is not): refused even when told.
    with pytest.raises(ConfigError) as exc:
        load_secret(environ=env)
    assert exc.value.reason == "file_not_mounted"
    monkeypatch.setattr(files, "_on_read_only_mount", lambda fd: True)
    assert load_secret(environ=env).value == STRONG.encode()
    # megha up's rule is unchanged: without MEGHA_SECRET_MOUNTED the symlink is refused.
    with pytest.raises(ConfigError) as exc:
        load_secret(environ={SECRET_FILE_ENV: str(path)})
    assert exc.value.reason == "file_not_regular"
    # A weak secret is still weak when mounted.
    weak = secret_volume(tmp_path / "weak", "megha-dev-secret-change-me")
    with pytest.raises(ConfigError) as exc:
        load_secret(environ={**env, SECRET_FILE_ENV: str(weak)})
    assert exc.value.reason == "weak_secret"
    # World-readable (defaultMode 0444) is refused.
    loose = secret_volume(tmp_path / "loose", STRONG, mode=0o444)
    with pytest.raises(ConfigError) as exc:
        load_secret(environ={**env, SECRET_FILE_ENV: str(loose)})
    assert exc.value.reason == "file_not_private"


def test_a_mounted_secret_may_not_lead_out_of_its_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(files, "_on_read_only_mount", lambda fd: True)
    elsewhere = create_secret_file(tmp_path / "home")
    vol = tmp_path / "vol"
    vol.mkdir()
    (vol / "secret").symlink_to(elsewhere)
    with pytest.raises(ConfigError) as exc:
        load_secret(vol / "secret", environ={files.MOUNTED_ENV: "1"})
    assert exc.value.reason == "file_not_regular"
    # A private file of ours is accepted as before, mounted or not.
    assert load_secret(elsewhere, environ={files.MOUNTED_ENV: "1"}).value


def load_as_pod(volume: Path, env: dict[str, str], *, read_only: bool) -> str:
    """``load_secret`` in a process of uid/gid 10001 (the pods'), in a mount namespace of
    its own where ``volume`` is bind-mounted read-only (or not): the reason it refuses,
    or "accepted"."""
    script = f"""
import os, sys
sys.path.insert(0, {str(REPO)!r})
from common.errors import ConfigError
from security.secret import load_secret
os.setgroups([]); os.setgid({POD_GID}); os.setuid({POD_UID})  # imports done: the pod's ids
try:
    load_secret(environ={env!r})
    print("accepted")
except ConfigError as exc:
    print(exc.reason)
"""
    mount = f"mount --bind -o ro '{volume}' '{volume}' && " if read_only else ""
    out = subprocess.run(
        ["unshare", "-m", "sh", "-c", mount + 'exec "$0" -c "$1"', sys.executable, script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={"PATH": os.environ.get("PATH", ""), "PYTHONDONTWRITEBYTECODE": "1"},
    )
    if out.returncode != 0 and "mount" in out.stderr + out.stdout:
        pytest.skip(f"no private read-only mount here: {out.stderr.strip()[:200]}")
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def test_a_pod_process_reads_a_kubelet_like_volume_only_as_mounted(tmp_path: Path) -> None:
    """For real: a non-root process, a root-owned 0440 file of the pod's group behind
    ``..data`` symlinks, on a read-only bind mount (what the kubelet gives with
    ``defaultMode: 0400`` and ``fsGroup``)."""
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare: a mount namespace and another uid")
    top = Path(tempfile.mkdtemp(prefix="megha-pod-"))  # tmp_path is 0700: not for uid 10001
    try:
        top.chmod(0o755)
        path = secret_volume(top / "secret", STRONG)
        os.chown(path.resolve(), 0, POD_GID)
        env = {SECRET_FILE_ENV: str(path), files.MOUNTED_ENV: "1"}
        assert load_as_pod(top / "secret", env, read_only=True) == "accepted"
        assert load_as_pod(top / "secret", env, read_only=False) == "file_not_mounted"
        plain = {SECRET_FILE_ENV: str(path)}  # megha up's rule: a symlink, root's
        assert load_as_pod(top / "secret", plain, read_only=True) == "file_not_regular"
        os.chown(path.resolve(), 0, 0)  # no fsGroup: the pod cannot even open it
        assert load_as_pod(top / "secret", env, read_only=True) != "accepted"
    finally:
        shutil.rmtree(top)
