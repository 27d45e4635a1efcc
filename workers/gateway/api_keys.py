"""The gateway's API keys: read from the settings (the environment, or a file of one key or
``sha256:HEX`` digest a line), kept and compared only as SHA-256 digests."""

from __future__ import annotations

import hashlib
import hmac
import re
from dataclasses import dataclass

from config.errors import ConfigError
from config.settings import GatewaySettings

DIGEST_PREFIX = "sha256:"
HEX_DIGEST = re.compile(r"^[0-9a-f]{64}$")


def key_digest(key: str) -> str:
    """The SHA-256 digest of ``key``, as lowercase hex: what a key file may hold instead of
    the key itself (``sha256:`` and this)."""
    return hashlib.sha256(key.encode()).hexdigest()


@dataclass(frozen=True)
class KeyRing:
    """The digests of the keys the gateway admits."""

    digests: tuple[str, ...]

    def admits(self, presented: str) -> bool:
        """Whether ``presented`` is one of the keys, compared digest to digest in constant
        time, every digest each time."""
        candidate = key_digest(presented)
        matches = [hmac.compare_digest(candidate, known) for known in self.digests]
        return any(matches)


def _entry_digest(entry: str, source: str) -> str:
    if not entry.startswith(DIGEST_PREFIX):
        return key_digest(entry)
    digest = entry.removeprefix(DIGEST_PREFIX).lower()
    if not HEX_DIGEST.match(digest):
        raise ConfigError(f"{source}: a sha256: entry needs 64 hex digits")
    return digest


def load_keys(settings: GatewaySettings) -> KeyRing:
    """The keys of ``settings.api_keys`` (comma-separated) and of ``settings.api_keys_file``
    (blank lines and ``#`` comments skipped).

    Raises:
        ConfigError: no key is given, the file cannot be read, or a digest is malformed.
    """
    digests: list[str] = []
    if settings.api_keys is not None:
        for entry in settings.api_keys.get_secret_value().split(","):
            if entry.strip():
                digests.append(_entry_digest(entry.strip(), "gateway.api_keys"))
    if settings.api_keys_file is not None:
        try:
            text = settings.api_keys_file.read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"gateway.api_keys_file: {exc}") from exc
        for line in text.splitlines():
            entry = line.strip()
            if entry and not entry.startswith("#"):
                digests.append(_entry_digest(entry, str(settings.api_keys_file)))
    if not digests:
        raise ConfigError(
            "the gateway needs an API key: set BATCHFLEET_GATEWAY__API_KEYS (comma-separated)"
            " or BATCHFLEET_GATEWAY__API_KEYS_FILE (one key or sha256:HEX a line)"
        )
    return KeyRing(tuple(dict.fromkeys(digests)))
