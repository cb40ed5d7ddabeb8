"""Test oracles: small, obviously correct restatements the tests compare the product with."""
