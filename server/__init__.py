"""The snet server daemon: connections, element pool, update rules, modes, HTTP API."""
