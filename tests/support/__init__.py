"""Helpers shared by tests: running servers, signing requests, reading the database."""
