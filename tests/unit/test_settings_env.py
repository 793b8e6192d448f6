"""`dsv4 run` names each DSV4_* variable it does not read, instead of ignoring a typo."""

from __future__ import annotations

from dsv4_operator.settings import OTHER_PROGRAMS_VARIABLES, unknown_settings


def test_a_misspelt_setting_is_named_with_the_closest_one() -> None:
    [warning] = unknown_settings({"DSV4_WEBHOOK_HOST": "0.0.0.0", "PATH": "/bin"})
    assert warning.startswith("DSV4_WEBHOOK_HOST is not a setting of dsv4 run and is ignored")
    assert warning.endswith("; did you mean DSV4_WEBHOOK_URL_HOST?")
    [plural] = unknown_settings({"DSV4_NAMESPACE": "a"})
    assert plural.endswith("; did you mean DSV4_NAMESPACES?")


def test_settings_in_any_case_and_the_weights_jobs_variables_pass_quietly() -> None:
    environ = {
        "DSV4_NAMESPACES": "a",
        "dsv4_log_level": "INFO",
        **{variable: "x" for variable in OTHER_PROGRAMS_VARIABLES},
    }
    assert unknown_settings(environ) == []


def test_a_name_far_from_every_setting_gets_no_guess() -> None:
    assert unknown_settings({"DSV4_ZZZZZZZZZZZZ": "1"}) == [
        "DSV4_ZZZZZZZZZZZZ is not a setting of dsv4 run and is ignored"
    ]
