"""The HTTP gateway: the fleet behind OpenAI's API (``batchfleet gateway``), for any language
and the official clients. It is a producer like any other and holds no state of its own."""
