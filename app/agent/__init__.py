"""The agent: providers, tools and the run loop."""
