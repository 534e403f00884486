"""What the facade keeps: the store protocol, its SQLite and PostgreSQL backends on shared SQL,
conversations, uploaded files, quotas and upkeep."""
