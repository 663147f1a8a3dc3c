"""Usage of model calls, their cost and budgets (docs/usage.md)."""
