"""A model's reply says why it ended in one vocabulary, whatever the vendor called it; a
provider's failure says what kind it is in another (``ErrorCode``)."""

import json

import pytest

from conversations.core.types import ErrorCode, Finish, ModelReply
from conversations.providers import ProviderError
from conversations.providers.anthropic import AnthropicProvider
from conversations.providers.openai import OpenAIProvider


def openai_reply(finish_reason, **message):
    return {"choices": [{"index": 0, "finish_reason": finish_reason,
                         "message": {"role": "assistant", "content": "Hi.", **message}}]}


def anthropic_reply(stop_reason):
    return {"type": "message", "role": "assistant", "content": [{"type": "text", "text": "Hi."}],
            "stop_reason": stop_reason}


@pytest.mark.parametrize("vendor, finish", [("stop", Finish.STOP), ("length", Finish.LENGTH),
                                            ("content_filter", Finish.REFUSED), (None, Finish.STOP),
                                            ("something_new", Finish.STOP)])
def test_an_openai_finish_reason_becomes_one_of_ours(vendor, finish):
    assert OpenAIProvider({}).parse(openai_reply(vendor)).finish is finish


@pytest.mark.parametrize("vendor, finish", [("end_turn", Finish.STOP), ("max_tokens", Finish.LENGTH),
                                            ("refusal", Finish.REFUSED), ("tool_use", Finish.STOP)])
def test_an_anthropic_stop_reason_becomes_one_of_ours(vendor, finish):
    # "tool_use" without a tool_use block: the text is the answer
    assert AnthropicProvider({"MODEL": "m"}).parse(anthropic_reply(vendor)).finish is finish


def test_a_reply_ends_as_a_final_answer_unless_it_says_otherwise():
    assert ModelReply(text="Hi.").finish is Finish.STOP


def test_an_error_code_reads_as_the_string_it_always_was():
    error = ProviderError("auth", "HTTP 401")
    assert error.code is ErrorCode.AUTH
    # What logs, the admin's timeline and any JSON show is unchanged.
    assert (str(error), f"{error.code}: x", json.dumps({"code": error.code})) == (
        "auth: HTTP 401", "auth: x", '{"code": "auth"}')
    assert set(ProviderError.MESSAGES) == set(ErrorCode)  # every kind has its visitor's sentence


def test_a_custom_providers_own_code_is_kept_and_reads_as_a_refused_request():
    error = ProviderError("acme_quota", "over quota")
    assert error.code == "acme_quota"
    assert error.message == str(ProviderError.MESSAGES[ErrorCode.BAD_REQUEST])
