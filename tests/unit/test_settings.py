"""Settings load from the environment and a TOML file, and refuse inconsistent limits."""

import re
from pathlib import Path

import pytest

from config.errors import ConfigError
from config.settings import load_settings


def test_defaults_serve_one_synthetic_model(monkeypatch: pytest.MonkeyPatch) -> None:
    """With no configuration the fleet serves 'synthetic' with max batch 32 and a 15 ms wait."""
    monkeypatch.delenv("BATCHFLEET_CONFIG", raising=False)
    settings = load_settings()
    policy = settings.policy("synthetic")
    assert list(settings.models) == ["synthetic"]
    assert (policy.backend, policy.max_batch_size, policy.max_wait_s) == ("synthetic", 32, 0.015)


def test_environment_overrides_nested_fields(monkeypatch: pytest.MonkeyPatch) -> None:
    """BATCHFLEET_REDIS_URL and nested BATCHFLEET_X__Y variables reach the settings."""
    monkeypatch.setenv("BATCHFLEET_REDIS_URL", "redis://:secret@host:1/2")
    monkeypatch.setenv("BATCHFLEET_MODELS__SYNTHETIC__MAX_BATCH_SIZE", "8")
    monkeypatch.setenv("BATCHFLEET_WORKER__HEARTBEAT_S", "2.5")
    settings = load_settings()
    assert settings.redis_url.get_secret_value() == "redis://:secret@host:1/2"
    assert "secret" not in repr(settings)
    assert settings.policy("synthetic").max_batch_size == 8
    assert settings.worker.heartbeat_s == 2.5


def test_toml_file_configures_models(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A TOML file named by BATCHFLEET_CONFIG adds models; the environment still wins."""
    config = tmp_path / "batchfleet.toml"
    config.write_text(
        'key_prefix = "prod"\n[models.small]\nbackend = "synthetic"\nmax_batch_size = 4\n'
        "[models.small.options]\nbase_ms = 1\n"
    )
    monkeypatch.setenv("BATCHFLEET_CONFIG", str(config))
    monkeypatch.setenv("BATCHFLEET_KEY_PREFIX", "env")
    settings = load_settings()
    assert settings.key_prefix == "env"
    assert settings.policy("small").max_batch_size == 4
    assert settings.policy("small").options == {"base_ms": 1}


@pytest.mark.parametrize("name", ["a:b", "{a}", "a}b"])
def test_a_model_name_that_would_break_its_keys_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, name: str
) -> None:
    """':' separates a key's parts and '{…}' is its Redis Cluster hash tag: a model name
    holding either is refused at start, naming it."""
    config = tmp_path / "batchfleet.toml"
    config.write_text(f'[models."{name}"]\nbackend = "synthetic"\n')
    monkeypatch.setenv("BATCHFLEET_CONFIG", str(config))
    with pytest.raises(ConfigError, match=re.escape(f"invalid model name {name!r}")):
        load_settings()


def test_missing_config_file_is_a_config_error(monkeypatch: pytest.MonkeyPatch) -> None:
    """A BATCHFLEET_CONFIG that names no file fails with one clear error."""
    monkeypatch.setenv("BATCHFLEET_CONFIG", "/nonexistent/batchfleet.toml")
    with pytest.raises(ConfigError, match="no such file"):
        load_settings()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("WORKER__TIME_LIMIT_S", "10"),
        ("BATCHER__RECLAIM_LEASE_S", "40"),
        ("WORKER__CONCURRENCY", "3"),
        ("WORKER__HEARTBEAT_S", "20"),
    ],
)
def test_time_limits_must_be_ordered(
    monkeypatch: pytest.MonkeyPatch, field: str, value: str
) -> None:
    """soft < hard limit < reclaim lease, reserved batches x hard limit < lease and a dead
    worker seen dead before the lease ends, or the fleet refuses to start."""
    monkeypatch.setenv(f"BATCHFLEET_{field}", value)
    with pytest.raises(ConfigError, match="must be below"):
        load_settings()


@pytest.mark.parametrize("source", ["environment", "config file"])
def test_a_retired_setting_starts_the_fleet_with_a_warning(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    caplog: pytest.LogCaptureFixture,
    source: str,
) -> None:
    """A configuration of an earlier release that sets the Celery visibility timeout still
    loads: the setting is named in a warning saying it has no effect, not refused."""
    if source == "environment":
        monkeypatch.setenv("BATCHFLEET_WORKER__VISIBILITY_TIMEOUT_S", "50")
    else:
        config = tmp_path / "batchfleet.toml"
        config.write_text("[worker]\nvisibility_timeout_s = 50\n")
        monkeypatch.setenv("BATCHFLEET_CONFIG", str(config))
    settings = load_settings()
    assert settings.worker.time_limit_s == 15.0
    assert "worker.visibility_timeout_s is set but has no effect" in caplog.text


def test_bad_values_name_the_field(monkeypatch: pytest.MonkeyPatch) -> None:
    """A wrong value is reported with the field it belongs to."""
    monkeypatch.setenv("BATCHFLEET_MODELS__SYNTHETIC__MAX_BATCH_SIZE", "0")
    with pytest.raises(ConfigError, match="max_batch_size"):
        load_settings()


@pytest.mark.parametrize(
    ("variable", "closest"),
    [
        ("BATCHFLEET_REDIS_UR", "BATCHFLEET_REDIS_URL"),
        ("BATCHFLEET_MAX_BATCH_SIZE", "BATCHFLEET_MODELS__<MODEL>__MAX_BATCH_SIZE"),
        ("BATCHFLEET_WORKER_CONCURRENCY", "BATCHFLEET_WORKER__CONCURRENCY"),
        ("batchfleet_confg", "BATCHFLEET_CONFIG"),
    ],
)
def test_a_misspelled_variable_is_refused_naming_the_closest_setting(
    monkeypatch: pytest.MonkeyPatch, variable: str, closest: str
) -> None:
    """A BATCHFLEET_* variable that names no setting stops the load: ignored, it would leave
    the fleet on a default (another Redis, another batch size) without a word."""
    monkeypatch.setenv(variable, "redis://elsewhere:6379/0")
    with pytest.raises(
        ConfigError,
        match=rf"{variable} is not a batchfleet setting; did you mean {re.escape(closest)}\?",
    ):
        load_settings()


def test_a_variable_far_from_every_setting_is_refused_without_a_guess(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """No setting is near enough to suggest: the refusal names only the variable."""
    monkeypatch.setenv("BATCHFLEET_FOO", "1")
    with pytest.raises(ConfigError, match=r"BATCHFLEET_FOO is not a batchfleet setting$"):
        load_settings()
