"""The Redis version gate: batchfleet refuses a server older than 6.2 with a clear error."""

from __future__ import annotations

from typing import Any

import pytest

from config.connection import parse_version, require_supported_redis
from config.errors import UnsupportedRedis


class ReportsVersion:
    """A client whose server answers ``HELLO 2`` as Redis does, with ``version``."""

    def __init__(self, version: str) -> None:
        self.version = version

    def execute_command(self, *args: Any) -> list[Any]:
        assert args == ("HELLO", "2")
        return [b"server", b"redis", b"version", self.version.encode(), b"proto", 2]


@pytest.mark.parametrize("version", ["6.2.14", "7.0.15", "7.4.1", "8.0.2", "10.0.0"])
def test_redis_6_2_and_newer_are_accepted(version: str) -> None:
    """The embedded 6.2, Debian's 7.0 and later releases pass the gate."""
    assert require_supported_redis(ReportsVersion(version)) == version  # type: ignore[arg-type]


@pytest.mark.parametrize("version", ["6.0.20", "5.0.7", "2.8.24"])
def test_a_server_older_than_6_2_is_refused_naming_both_versions(version: str) -> None:
    """An old server is a typed error that says what is needed and what was found."""
    with pytest.raises(UnsupportedRedis, match=rf"needs Redis 6\.2 or newer.*runs Redis {version}"):
        require_supported_redis(ReportsVersion(version))  # type: ignore[arg-type]


def test_versions_compare_by_number_not_by_text() -> None:
    """6.10 is newer than 6.2; a suffix such as "-rc1" ends the comparison."""
    assert parse_version("6.10.0") > parse_version("6.2.0")
    assert parse_version("7.2.0-rc1") == (7, 2)
