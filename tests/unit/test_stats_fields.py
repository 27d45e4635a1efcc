"""The stats hash's field names are pinned: metrics, dashboards and alerts read these strings."""

from config import stats_fields


def test_every_stats_field_has_its_exact_string() -> None:
    """Fields are ``kind`` or ``kind:label``, exactly as documented."""
    assert stats_fields.ACCEPTED == "accepted"
    assert stats_fields.COMPLETED == "completed"
    assert stats_fields.refused("queue_full") == "refused:queue_full"
    assert stats_fields.refused("id_conflict") == "refused:id_conflict"
    assert stats_fields.failed("cancelled") == "failed:cancelled"
    assert stats_fields.batches("size") == "batches:size"
    assert stats_fields.CACHE_HIT == "cache:hit"
    assert stats_fields.CACHE_MISS == "cache:miss"
    assert stats_fields.parse("failed:expired") == ("failed", "expired")
    assert stats_fields.parse("accepted") == ("accepted", "")
