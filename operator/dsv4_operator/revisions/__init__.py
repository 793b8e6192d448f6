"""Config hashing and the P/D transfer-format key."""
