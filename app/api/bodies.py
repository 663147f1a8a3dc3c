"""The base of admin request bodies: text no store can hold is refused (422), on both backends.

PostgreSQL refuses NUL in text and SQLite stores it; lone surrogates have no UTF-8 form.
Checking the parsed body makes the answer the same everywhere, before anything is written.
"""

from __future__ import annotations

from typing import Self

from pydantic import BaseModel, model_validator

from app.events import unstorable_in


class RequestBody(BaseModel):
    @model_validator(mode="after")
    def _storable_text(self) -> Self:
        if unstorable_in(self.model_dump()):
            raise ValueError("text contains a NUL character or a lone surrogate (\\u0000, \\ud800-\\udfff)")
        return self
