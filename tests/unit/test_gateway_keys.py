"""The gateway's API keys: given as keys or as ``sha256:`` digests, in the environment or a
file, held and compared only as digests; a gateway without one does not start."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import SecretStr

from config.errors import ConfigError
from config.settings import GatewaySettings
from workers.gateway.api_keys import key_digest, load_keys


def test_keys_from_the_environment_and_a_file_are_admitted_and_others_not(tmp_path: Path) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(f"# team b\n\nsha256:{key_digest('sk-b').upper()}\nsk-c\n")
    ring = load_keys(GatewaySettings(api_keys=SecretStr("sk-a, sk-d"), api_keys_file=key_file))
    assert all(ring.admits(key) for key in ("sk-a", "sk-b", "sk-c", "sk-d"))
    assert not ring.admits("sk-e")
    assert not ring.admits("")
    assert "sk-a" not in repr(ring) and "sk-c" not in repr(ring)


def test_a_gateway_without_a_key_does_not_start() -> None:
    with pytest.raises(ConfigError, match="needs an API key"):
        load_keys(GatewaySettings())


@pytest.mark.parametrize("entry", ["sha256:abc", "sha256:" + "g" * 64])
def test_a_malformed_digest_is_refused(tmp_path: Path, entry: str) -> None:
    key_file = tmp_path / "keys"
    key_file.write_text(entry + "\n")
    with pytest.raises(ConfigError, match="64 hex digits"):
        load_keys(GatewaySettings(api_keys_file=key_file))


def test_an_unreadable_key_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="api_keys_file"):
        load_keys(GatewaySettings(api_keys_file=tmp_path / "missing"))
