"""The browser gateway: `WS /ws` protocol, tokens, fan-out across replicas (docs/gateway.md)."""
