"""Request schemas (the fields of SGLang's requests the stand-in honours) and error bodies."""

from __future__ import annotations

from http import HTTPStatus
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

_EXTRA = ConfigDict(extra="allow")


def openai_error(message: str, status: int = 400, err_type: str = "BadRequestError") -> dict[str, Any]:
    """SGLang's `ErrorResponse` body (OpenAI-compatible endpoints and validation errors)."""
    return {"object": "error", "message": message, "type": err_type, "param": None, "code": status}


def validation_error(message: str) -> dict[str, Any]:
    """What SGLang's RequestValidationError handler answers (400, type 'Bad Request')."""
    return openai_error(message, 400, HTTPStatus.BAD_REQUEST.phrase)


def generate_error(message: str) -> dict[str, Any]:
    """The body `/generate` answers on a ValueError."""
    return {"error": {"message": message}}


def _stop_list(value: str | list[str] | None) -> list[str]:
    if value is None:
        return []
    return [value] if isinstance(value, str) else value


class SamplingParams(BaseModel):
    model_config = _EXTRA

    max_new_tokens: int | None = Field(default=128, ge=0)
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    temperature: float = Field(default=1.0, ge=0)
    top_p: float = Field(default=1.0, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=1)
    sampling_seed: int | None = None

    @property
    def stops(self) -> list[str]:
        return _stop_list(self.stop)


class GenerateRequest(BaseModel):
    """`POST /generate`: one prompt (`text` or `input_ids`) or a batch of them."""

    model_config = _EXTRA

    text: str | list[str] | None = None
    input_ids: list[int] | list[list[int]] | None = None
    sampling_params: SamplingParams | list[SamplingParams] | None = None
    rid: str | list[str] | None = None
    stream: bool = False

    @model_validator(mode="after")
    def _one_input(self) -> GenerateRequest:
        if (self.text is None) == (self.input_ids is None):
            raise ValueError("Either text or input_ids should be provided.")
        return self

    @property
    def is_batch(self) -> bool:
        if self.text is not None:
            return isinstance(self.text, list)
        return bool(self.input_ids) and isinstance(self.input_ids[0], list)


class ContentPart(BaseModel):
    model_config = _EXTRA

    type: str
    text: str | None = None


class ChatMessage(BaseModel):
    model_config = _EXTRA

    role: str
    content: str | list[ContentPart] | None = None

    @property
    def text(self) -> str:
        if self.content is None:
            return ""
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text or "" for part in self.content if part.type == "text")


class StreamOptions(BaseModel):
    model_config = _EXTRA

    include_usage: bool = False


class _OpenAIRequest(BaseModel):
    model_config = _EXTRA

    model: str = "default"
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    temperature: float | None = Field(default=None, ge=0, le=2)
    top_p: float | None = Field(default=None, gt=0, le=1)
    n: int = Field(default=1, ge=1, le=1)
    seed: int | None = None
    stream: bool = False
    stream_options: StreamOptions | None = None

    @property
    def stops(self) -> list[str]:
        return _stop_list(self.stop)

    @property
    def include_usage(self) -> bool:
        return bool(self.stream_options and self.stream_options.include_usage)


class ChatCompletionRequest(_OpenAIRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    separate_reasoning: bool = True  # SGLang's field: split reasoning_content off (with --reasoning-parser)
    max_tokens: int | None = Field(default=None, ge=0)
    max_completion_tokens: int | None = Field(default=None, ge=0)

    @property
    def limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens

    def render(self) -> str:
        """The prompt the chat template makes of the messages."""
        parts = [f"<|{message.role}|> {message.text}\n" for message in self.messages]
        parts.append("<|assistant|>")
        return "".join(parts)


class CompletionRequest(_OpenAIRequest):
    prompt: str | list[str] | list[int]
    max_tokens: int | None = Field(default=16, ge=0)

    @field_validator("prompt")
    @classmethod
    def _not_empty_batch(cls, value: str | list[str] | list[int]) -> str | list[str] | list[int]:
        if isinstance(value, list) and not value:
            raise ValueError("prompt must not be an empty list")
        return value
