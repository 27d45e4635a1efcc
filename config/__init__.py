"""The contract every batchfleet process shares: settings, Redis keys, wire format, errors."""
