"""The guarded fetcher: every URL a payload or a model controls is fetched through it."""

from app.fetch.decode import TooLarge
from app.fetch.fetcher import Fetched, FetchError, FetchRefused, GuardedFetcher, Resolver, system_resolver

__all__ = [
    "FetchError",
    "FetchRefused",
    "Fetched",
    "GuardedFetcher",
    "Resolver",
    "TooLarge",
    "system_resolver",
]
