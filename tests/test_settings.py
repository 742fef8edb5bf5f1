"""The merged CONVERSATIONS configuration: one object every caller shares, which none can change."""

import pytest

from conversations.conf import get_config
from tests.helpers import FAST


def test_the_shared_configuration_cannot_be_changed_by_a_caller(conversations_settings):
    conversations_settings.update(TOOLS=["chatproject.tools.current_time"])
    cfg = get_config()

    with pytest.raises(TypeError):
        cfg["JOB_TIMEOUT"] = 1
    with pytest.raises(AttributeError):
        cfg["TOOLS"].append("chatproject.tools.search_faq")

    assert get_config()["JOB_TIMEOUT"] == FAST["JOB_TIMEOUT"]
    assert list(get_config()["TOOLS"]) == ["chatproject.tools.current_time"]
    assert {**cfg, "JOB_TIMEOUT": 1}["JOB_TIMEOUT"] == 1  # a copy is the caller's to change


def test_list_settings_from_the_environment_are_split_on_commas(conversations_settings):
    conversations_settings.update(TOOLS=" chatproject.tools.current_time, ,chatproject.tools.search_faq ")
    assert get_config()["TOOLS"] == ("chatproject.tools.current_time", "chatproject.tools.search_faq")
